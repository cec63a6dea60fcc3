//! `replay --report-dir DIR`: the JSON report, the timeline and four PNG plots.
//!
//! ## Workflow ([`write_report_dir`])
//!
//! 1. Create `DIR` (and its parents) if needed.
//! 2. Write `report.json` (the same object `--json` prints) and `timeline.json` (the
//!    [`Timeline`]: bucket width, buckets, sorted TTFTs).
//! 3. Find a `TrueType` font (`DejaVu Sans` or `Liberation Sans` in the usual system places) and
//!    register it with plotters once per process; without one, fail naming the paths
//!    searched and the package that brings one (`fonts-dejavu-core`), after the JSON files
//!    are written.
//! 4. Draw, with plotters' bitmap backend, 1000 x 600 pixels each:
//!    - `reuse.png`: per bucket, the share of the prompt tokens of requests whose first
//!      token came out in it that the pool served, the oracle's share, the local prefix
//!      cache's share when it was on, and the running share over the run so far (its last
//!      point is the report's `reused_share_of_prompt`);
//!    - `lookups.png`: lookup outcomes per bucket, stacked (their sum is `lookups`);
//!    - `ttft.png`: the TTFT histogram with the report's p50 and p99 marked;
//!    - `throughput.png`: saver MiB/s stored (and saves dropped) over time above, loader
//!      tokens/s filled (and loads failed) below.
//!
//! [`check_report_dir`] does step 1 before the replay starts and proves the directory
//! takes a file, so a bad `DIR` fails at once, not after the run.
//!
//! Every caption repeats the report's figure for the quantity plotted, so a reader checks
//! the picture against the table at a glance.

use std::error::Error as StdError;
use std::fs;
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use plotters::coord::Shift;
use plotters::prelude::*;
use serde::Serialize;

use super::report::ReplayReport;
use super::timeline::Timeline;

mod charts;

use charts::{draw_lookups, draw_reuse, draw_throughput, draw_ttft};

/// Fonts tried in order, the first that exists is used.
const FONT_PATHS: [&str; 6] = [
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
    "/usr/share/fonts/liberation-sans/LiberationSans-Regular.ttf",
    "/System/Library/Fonts/Supplemental/Arial.ttf",
];

/// The font family name the plots ask for.
const FAMILY: &str = "sans-serif";

/// Pixel size of each plot.
const SIZE: (u32, u32) = (1000, 600);

/// The files [`write_report_dir`] writes, in order.
pub const REPORT_FILES: [&str; 6] = [
    "report.json",
    "timeline.json",
    "reuse.png",
    "lookups.png",
    "ttft.png",
    "throughput.png",
];

/// Why the report directory could not be written.
#[derive(Debug, thiserror::Error)]
pub enum PlotError {
    /// Creating the directory or writing a file failed.
    #[error("cannot write {}", path.display())]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: io::Error,
    },
    /// Encoding a JSON file failed.
    #[error("cannot encode {} as json", path.display())]
    Json {
        /// The file.
        path: PathBuf,
        /// The encoder's error.
        #[source]
        source: serde_json::Error,
    },
    /// No usable font for the plots' text.
    #[error(
        "no font for the plots: none of {searched} is a readable TrueType font; install one \
         (e.g. `apt-get install fonts-dejavu-core`); report.json and timeline.json are written"
    )]
    NoFont {
        /// The paths tried, comma separated.
        searched: String,
    },
    /// Drawing or encoding a plot failed.
    #[error("cannot draw {}", path.display())]
    Draw {
        /// The image file.
        path: PathBuf,
        /// plotters' error.
        #[source]
        source: Box<dyn StdError + Send + Sync>,
    },
}

impl PlotError {
    /// A short, stable label for metrics and logs.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Io { .. } => "io",
            Self::Json { .. } => "json",
            Self::NoFont { .. } => "no_font",
            Self::Draw { .. } => "draw",
        }
    }
}

/// Writes the report, the timeline and the plots into `dir` (module workflow); returns the
/// paths written, in [`REPORT_FILES`] order.
///
/// # Errors
///
/// [`PlotError::Io`] or [`PlotError::Json`] for a file that cannot be written,
/// [`PlotError::NoFont`] when no font is found (the JSON files are written first),
/// [`PlotError::Draw`] when plotters fails.
pub fn write_report_dir(
    dir: &Path,
    report: &ReplayReport,
    timeline: &Timeline,
) -> Result<Vec<PathBuf>, PlotError> {
    fs::create_dir_all(dir).map_err(|source| PlotError::Io {
        path: dir.to_owned(),
        source,
    })?;
    let paths: Vec<PathBuf> = REPORT_FILES.iter().map(|name| dir.join(name)).collect();
    write_json(&paths[0], report)?;
    write_json(&paths[1], timeline)?;
    register_font()?;
    draw(&paths[2], |area| draw_reuse(area, report, timeline))?;
    draw(&paths[3], |area| draw_lookups(area, report, timeline))?;
    draw(&paths[4], |area| draw_ttft(area, report, timeline))?;
    draw(&paths[5], |area| draw_throughput(area, report, timeline))?;
    Ok(paths)
}

/// Checks, before a replay, that `dir` can take the report: creates it (and its parents)
/// if needed, then writes and removes a probe file.
///
/// # Errors
///
/// [`PlotError::Io`] naming the directory or the probe file.
pub fn check_report_dir(dir: &Path) -> Result<(), PlotError> {
    fs::create_dir_all(dir).map_err(|source| PlotError::Io {
        path: dir.to_owned(),
        source,
    })?;
    let probe = dir.join(".kv-connector-write-check");
    let io_error = |source| PlotError::Io {
        path: probe.clone(),
        source,
    };
    fs::write(&probe, b"").map_err(io_error)?;
    fs::remove_file(&probe).map_err(io_error)
}

/// One pretty-printed JSON file.
fn write_json(path: &Path, value: &impl Serialize) -> Result<(), PlotError> {
    let io_error = |source| PlotError::Io {
        path: path.to_owned(),
        source,
    };
    let mut file = BufWriter::new(fs::File::create(path).map_err(io_error)?);
    serde_json::to_writer_pretty(&mut file, value).map_err(|source| PlotError::Json {
        path: path.to_owned(),
        source,
    })?;
    writeln!(file).and_then(|()| file.flush()).map_err(io_error)
}

/// Registers the first font found under [`FAMILY`], once per process (workflow step 3).
fn register_font() -> Result<(), PlotError> {
    static REGISTERED: OnceLock<bool> = OnceLock::new();
    let found = *REGISTERED.get_or_init(|| {
        FONT_PATHS.iter().any(|path| {
            let Ok(bytes) = fs::read(path) else {
                return false;
            };
            // Leaked once per process: plotters keeps registered fonts for its lifetime.
            let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
            plotters::style::register_font(FAMILY, FontStyle::Normal, bytes).is_ok()
        })
    });
    if found {
        Ok(())
    } else {
        Err(PlotError::NoFont {
            searched: FONT_PATHS.join(", "),
        })
    }
}

/// The error type of drawing on the bitmap backend.
type DrawResult =
    Result<(), DrawingAreaErrorKind<<BitMapBackend<'static> as DrawingBackend>::ErrorType>>;

/// Draws one PNG at `path` with `paint`.
fn draw(
    path: &Path,
    paint: impl FnOnce(&DrawingArea<BitMapBackend<'_>, Shift>) -> DrawResult,
) -> Result<(), PlotError> {
    let root = BitMapBackend::new(path, SIZE).into_drawing_area();
    let drawn = root
        .fill(&WHITE)
        .and_then(|()| paint(&root))
        .and_then(|()| root.present());
    drawn.map_err(|source| PlotError::Draw {
        path: path.to_owned(),
        source: Box::new(source),
    })
}
