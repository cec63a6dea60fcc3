//! The four charts of `--report-dir` (see the parent module for what each shows).

use plotters::coord::types::RangedCoordf64;
use plotters::coord::Shift;
use plotters::prelude::*;

use super::{DrawResult, FAMILY};
use crate::replay::report::{share, ReplayReport};
use crate::replay::timeline::{Timeline, TimelineBucket};
/// The middle of a bucket, simulated seconds.
fn mid(timeline: &Timeline, bucket: &TimelineBucket) -> f64 {
    bucket.start_s + timeline.bucket_s / 2.0
}

/// The x range of every time plot: 0 to the end of the last bucket (at least 1 s).
fn time_range(timeline: &Timeline) -> std::ops::Range<f64> {
    let end = timeline
        .buckets
        .last()
        .map_or(0.0, |bucket| bucket.start_s + timeline.bucket_s);
    0.0..end.max(1.0)
}

/// The builder of a full-page chart: caption, margins and label areas shared by
/// `reuse.png`, `lookups.png` and `ttft.png`.
fn page_chart<'a, 'b>(
    area: &'a DrawingArea<BitMapBackend<'b>, Shift>,
    caption: &str,
) -> ChartBuilder<'a, 'b, BitMapBackend<'b>> {
    let mut builder = ChartBuilder::on(area);
    builder
        .caption(caption, (FAMILY, 22))
        .margin(14)
        .x_label_area_size(44)
        .y_label_area_size(56);
    builder
}

/// The top of a count axis whose highest value is `highest`: the top third of the chart
/// stays free for the legend, so it never covers a bar or a mark.
fn count_axis_top(highest: f64) -> f64 {
    (highest.max(1.0) * 1.5).ceil()
}

/// How many labels a count axis ending at `top` gets: one per whole count on a short axis
/// (so no two ticks round to the same label), at most 11.
#[expect(
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    reason = "a small label count"
)]
fn count_labels(top: f64) -> usize {
    (top.clamp(0.0, 10.0) as usize) + 1
}

/// Count axes label whole numbers ("2 requests", not "2.0").
#[expect(
    clippy::trivially_copy_pass_by_ref,
    reason = "plotters passes labels by reference"
)]
fn whole(value: &f64) -> String {
    format!("{value:.0}")
}

/// The legend box every chart draws, at `position`.
fn draw_legend<'b>(
    chart: &mut ChartContext<'b, BitMapBackend<'b>, Cartesian2d<RangedCoordf64, RangedCoordf64>>,
    position: SeriesLabelPosition,
) -> DrawResult {
    chart
        .configure_series_labels()
        .position(position)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
}

/// One line of `reuse.png`: label, style, points.
type Series<'a> = (&'a str, ShapeStyle, Vec<(f64, f64)>);

/// `reuse.png`.
pub(super) fn draw_reuse(
    area: &DrawingArea<BitMapBackend<'_>, Shift>,
    report: &ReplayReport,
    timeline: &Timeline,
) -> DrawResult {
    let caption = format!(
        "prompt tokens reused: pool {:.1} % (oracle {:.1} %) of {} tokens",
        100.0 * report.reused_share_of_prompt,
        100.0 * share(report.oracle_reusable_tokens, report.prompt_tokens),
        report.prompt_tokens
    );
    let mut chart =
        page_chart(area, &caption).build_cartesian_2d(time_range(timeline), 0.0..105.0)?;
    chart
        .configure_mesh()
        .x_desc("simulated time (s), by first token")
        .y_desc("% of prompt tokens")
        .draw()?;
    let done: Vec<&TimelineBucket> = timeline
        .buckets
        .iter()
        .filter(|bucket| bucket.prompts_done > 0)
        .collect();
    let percent = |part: u64, whole: u64| 100.0 * share(part, whole);
    // The oracle first, wide and light, so the pool's line stays visible on top of it.
    let mut series: Vec<Series<'_>> = vec![
        (
            "oracle, per bucket",
            RGBColor(170, 170, 170).stroke_width(6),
            done.iter()
                .map(|b| {
                    (
                        mid(timeline, b),
                        percent(b.oracle_reusable_tokens, b.prompt_tokens),
                    )
                })
                .collect(),
        ),
        (
            "pool, per bucket",
            BLUE.stroke_width(2),
            done.iter()
                .map(|b| (mid(timeline, b), percent(b.reused_tokens, b.prompt_tokens)))
                .collect(),
        ),
    ];
    if report.setup.local_prefix_cache {
        series.push((
            "local prefix cache, per bucket",
            GREEN.stroke_width(2),
            done.iter()
                .map(|b| {
                    (
                        mid(timeline, b),
                        percent(b.local_hit_tokens, b.prompt_tokens),
                    )
                })
                .collect(),
        ));
    }
    let (mut reused, mut prompt) = (0, 0);
    let running = done
        .iter()
        .map(|b| {
            reused += b.reused_tokens;
            prompt += b.prompt_tokens;
            (mid(timeline, b), percent(reused, prompt))
        })
        .collect();
    series.push(("pool, running total", RED.stroke_width(2), running));
    for (label, style, points) in series {
        chart
            .draw_series(LineSeries::new(points.clone(), style))?
            .label(label)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], style));
        let dot = ShapeStyle {
            filled: true,
            ..style
        };
        chart.draw_series(points.into_iter().map(|p| Circle::new(p, 3, dot)))?;
    }
    draw_legend(&mut chart, SeriesLabelPosition::LowerRight)
}

/// Lookup outcome names and colours, in stacking order.
const OUTCOMES: [(&str, RGBColor); 7] = [
    ("full", RGBColor(44, 160, 44)),
    ("rewound", RGBColor(31, 119, 180)),
    ("checkpoint", RGBColor(23, 190, 207)),
    ("recovered", RGBColor(148, 103, 189)),
    ("window_miss", RGBColor(255, 127, 14)),
    ("full_miss", RGBColor(214, 39, 40)),
    ("outage", RGBColor(127, 127, 127)),
];

/// The outcome counts of a bucket in [`OUTCOMES`] order (lookups lost to an outage last).
fn outcome_counts(bucket: &TimelineBucket) -> [u64; 7] {
    let l = &bucket.lookups;
    [
        l.full,
        l.rewound,
        l.checkpoint,
        l.recovered,
        l.window_miss,
        l.full_miss,
        l.outage,
    ]
}

/// `lookups.png`.
#[expect(clippy::cast_precision_loss, reason = "counts of a plot")]
pub(super) fn draw_lookups(
    area: &DrawingArea<BitMapBackend<'_>, Shift>,
    report: &ReplayReport,
    timeline: &Timeline,
) -> DrawResult {
    let l = &report.lookups;
    let caption = format!(
        "lookups: {} full, {} rewound, {} checkpoint, {} recovered, {} window_miss, {} full_miss, {} outage",
        l.full, l.rewound, l.checkpoint, l.recovered, l.window_miss, l.full_miss, l.outage
    );
    let highest = timeline
        .buckets
        .iter()
        .map(|bucket| bucket.lookups.with_outage())
        .max()
        .unwrap_or(0)
        .max(1);
    let mut chart = page_chart(area, &caption)
        .build_cartesian_2d(time_range(timeline), 0.0..count_axis_top(highest as f64))?;
    chart
        .configure_mesh()
        .x_desc("simulated time (s)")
        .y_desc(format!("lookups per {:.1} s bucket", timeline.bucket_s))
        .y_labels(count_labels(count_axis_top(highest as f64)))
        .y_label_formatter(&whole)
        .draw()?;
    for (position, (label, color)) in OUTCOMES.into_iter().enumerate() {
        let bars = timeline.buckets.iter().filter_map(|bucket| {
            let counts = outcome_counts(bucket);
            let below: u64 = counts[..position].iter().sum();
            (counts[position] > 0).then(|| {
                let x0 = bucket.start_s + timeline.bucket_s * 0.1;
                let x1 = bucket.start_s + timeline.bucket_s * 0.9;
                let top = (below + counts[position]) as f64;
                Rectangle::new([(x0, below as f64), (x1, top)], color.filled())
            })
        });
        chart
            .draw_series(bars)?
            .label(label)
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], color.filled()));
    }
    draw_legend(&mut chart, SeriesLabelPosition::UpperRight)
}

/// Bins of the TTFT histogram.
const TTFT_BINS: usize = 40;

/// `ttft.png`.
#[expect(
    clippy::cast_precision_loss,
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    reason = "bin indices and counts of a plot"
)]
pub(super) fn draw_ttft(
    area: &DrawingArea<BitMapBackend<'_>, Shift>,
    report: &ReplayReport,
    timeline: &Timeline,
) -> DrawResult {
    let sim = &report.sim;
    let without = report.baseline.as_ref().map(|b| &b.without_connector);
    let caption = format!(
        "time to first token, {} requests: p50 {:.3} s, p99 {:.3} s, max {:.3} s",
        timeline.ttft_s.len(),
        sim.ttft_p50_s,
        sim.ttft_p99_s,
        sim.ttft_max_s
    );
    let highest_ttft = timeline.ttft_s.last().copied().unwrap_or(0.0);
    let max = without
        .map_or(highest_ttft, |w| highest_ttft.max(w.ttft_p99_s))
        .max(1e-3)
        * 1.02;
    let width = max / TTFT_BINS as f64;
    let mut counts = [0_u64; TTFT_BINS];
    for &ttft in &timeline.ttft_s {
        counts[((ttft / width) as usize).min(TTFT_BINS - 1)] += 1;
    }
    let top = count_axis_top(counts.iter().copied().max().unwrap_or(0) as f64);
    let mut chart = page_chart(area, &caption).build_cartesian_2d(0.0..max, 0.0..top)?;
    chart
        .configure_mesh()
        .x_desc("time to first token (simulated s)")
        .y_desc("requests")
        .y_labels(count_labels(top))
        .y_label_formatter(&whole)
        .draw()?;
    chart.draw_series(counts.iter().enumerate().map(|(bin, &count)| {
        let x0 = bin as f64 * width;
        Rectangle::new(
            [(x0, 0.0), (x0 + width * 0.95, count as f64)],
            BLUE.mix(0.7).filled(),
        )
    }))?;
    let mut marks = vec![("p50", sim.ttft_p50_s, GREEN), ("p99", sim.ttft_p99_s, RED)];
    if let Some(without) = without {
        marks.push(("p50 without connector", without.ttft_p50_s, CYAN));
        marks.push(("p99 without connector", without.ttft_p99_s, MAGENTA));
    }
    for (label, value, color) in marks {
        chart
            .draw_series(LineSeries::new(
                [(value, 0.0), (value, top)],
                color.stroke_width(2),
            ))?
            .label(format!("{label} {value:.3} s"))
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
    }
    draw_legend(&mut chart, SeriesLabelPosition::UpperRight)
}

/// One panel of `throughput.png`: a rate per bucket, with a second count marked below it.
struct RatePanel<'a> {
    caption: String,
    y_desc: &'a str,
    color: RGBColor,
    rate: Vec<(f64, f64)>,
    marks_label: &'a str,
    marks: Vec<(f64, u64)>,
}

/// Draws one [`RatePanel`].
#[expect(clippy::cast_precision_loss, reason = "counts of a plot")]
fn draw_rate_panel(
    area: &DrawingArea<BitMapBackend<'_>, Shift>,
    timeline: &Timeline,
    panel: RatePanel<'_>,
) -> DrawResult {
    let highest = panel.rate.iter().map(|p| p.1).fold(0.0, f64::max).max(1e-9);
    let highest_mark = panel.marks.iter().map(|m| m.1).max().unwrap_or(0);
    let mut chart = ChartBuilder::on(area)
        .caption(panel.caption, (FAMILY, 20))
        .margin(10)
        .x_label_area_size(40)
        .y_label_area_size(64)
        .right_y_label_area_size(64)
        .build_cartesian_2d(time_range(timeline), 0.0..highest * 1.5)?
        .set_secondary_coord(
            time_range(timeline),
            0.0..count_axis_top(highest_mark as f64),
        );
    chart
        .configure_mesh()
        .x_desc("simulated time (s)")
        .y_desc(panel.y_desc)
        .draw()?;
    chart
        .configure_secondary_axes()
        .y_desc(format!("{} per bucket", panel.marks_label))
        .label_style((FAMILY, 14, &RED))
        .y_labels(count_labels(count_axis_top(highest_mark as f64)))
        .y_label_formatter(&whole)
        .draw()?;
    let color = panel.color;
    chart
        .draw_series(AreaSeries::new(panel.rate, 0.0, color.mix(0.3)).border_style(color))?
        .label(panel.y_desc)
        .legend(move |(x, y)| {
            Rectangle::new([(x, y - 5), (x + 12, y + 5)], color.mix(0.5).filled())
        });
    // Each bucket's count as a red stem and dot on the right-hand axis, so a bucket with
    // 300 drops stands out from one with 1.
    let marks: Vec<(f64, f64)> = panel
        .marks
        .into_iter()
        .filter(|&(_, count)| count > 0)
        .map(|(x, count)| (x, count as f64))
        .collect();
    chart.draw_secondary_series(
        marks
            .iter()
            .map(|&(x, count)| PathElement::new(vec![(x, 0.0), (x, count)], RED.stroke_width(2))),
    )?;
    chart
        .draw_secondary_series(
            marks
                .iter()
                .map(|&point| Circle::new(point, 4, RED.filled())),
        )?
        .label(panel.marks_label)
        .legend(|(x, y)| Circle::new((x + 6, y), 4, RED.filled()));
    draw_legend(&mut chart, SeriesLabelPosition::UpperRight)
}

/// `throughput.png`.
#[expect(clippy::cast_precision_loss, reason = "rates of a plot")]
pub(super) fn draw_throughput(
    area: &DrawingArea<BitMapBackend<'_>, Shift>,
    report: &ReplayReport,
    timeline: &Timeline,
) -> DrawResult {
    let panels = area.split_evenly((2, 1));
    let seconds = timeline.bucket_s.max(1e-9);
    let mib = 1024.0 * 1024.0;
    let step = |bucket: &TimelineBucket, value: f64| {
        [
            (bucket.start_s, value),
            (bucket.start_s + timeline.bucket_s, value),
        ]
    };
    let saver = RatePanel {
        caption: format!(
            "saver: {} pages, {:.1} MiB stored, {} dropped",
            report.pages_saved,
            report.bytes_saved as f64 / mib,
            report.saves_dropped
        ),
        y_desc: "MiB/s stored",
        color: RGBColor(31, 119, 180),
        rate: timeline
            .buckets
            .iter()
            .flat_map(|b| step(b, b.bytes_saved as f64 / mib / seconds))
            .collect(),
        marks_label: "saves dropped",
        marks: timeline
            .buckets
            .iter()
            .map(|b| (mid(timeline, b), b.saves_dropped))
            .collect(),
    };
    draw_rate_panel(&panels[0], timeline, saver)?;
    let loader = RatePanel {
        caption: format!(
            "loader: {} reservations filled, {} failed, {} tokens from the pool",
            report.loads_filled, report.loads_failed, report.reused_tokens
        ),
        y_desc: "tokens/s filled",
        color: RGBColor(44, 160, 44),
        rate: timeline
            .buckets
            .iter()
            .flat_map(|b| step(b, b.loaded_tokens as f64 / seconds))
            .collect(),
        marks_label: "loads failed",
        marks: timeline
            .buckets
            .iter()
            .map(|b| (mid(timeline, b), b.loads_failed))
            .collect(),
    };
    draw_rate_panel(&panels[1], timeline, loader)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn count_axes_leave_the_top_third_to_the_legend_and_label_whole_numbers() {
        for highest in [0.0, 1.0, 2.0, 7.0, 1790.0] {
            let top = count_axis_top(highest);
            assert!(
                highest <= top * 2.0 / 3.0 + 1e-9,
                "{highest} reaches the legend under {top}"
            );
            assert!(
                (top - top.round()).abs() < 1e-12,
                "the axis ends on a whole count"
            );
        }
        assert_eq!(whole(&2.0), "2");
        assert_eq!(count_labels(2.0), 3, "0, 1, 2");
        assert_eq!(count_labels(2685.0), 11);
        assert_eq!(whole(&1790.0), "1790");
    }
}
