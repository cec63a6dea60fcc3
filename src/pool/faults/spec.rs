//! Fault points and fault specs: which faults exist, at which rates (`--faults SPEC`).
//!
//! A spec is `name=value,...`: every fault point's rate in `[0, 1]`, plus `seed=N` and
//! `slow_ms=N`; the entry `default` sets every point to its [`FaultPoint::modest_rate`].

/// A named fault point. Pool points fire inside [`FaultyPool`](super::FaultyPool); actor
/// points in the actors.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum FaultPoint {
    /// A whole `exists` batch fails
    /// ([`PoolError::Unavailable`](crate::pool::PoolError::Unavailable) for every key).
    ExistsBatch,
    /// One key of an `exists` fails.
    Exists,
    /// A whole `put` batch fails; nothing is stored.
    PutBatch,
    /// One key of a `put` fails; it is not stored.
    Put,
    /// A whole `get_into` batch fails.
    GetBatch,
    /// One key of a `get_into` fails with a backend error.
    Get,
    /// A whole `touch` batch fails.
    TouchBatch,
    /// One key of a `touch` fails.
    Touch,
    /// An object is gone between probe and load: the get finds nothing.
    Evict,
    /// A got object has one header byte flipped.
    CorruptHeader,
    /// A got object has one payload byte flipped.
    CorruptPayload,
    /// A pool call answers `slow_ms` late.
    Slow,
    /// A `get_into` batch times out in the backend ([`PoolError::Timeout`](crate::pool::PoolError::Timeout)).
    Timeout,
    /// The pool client panics inside a `get_into` (the loader running it must survive).
    LoaderPanic,
    /// The pool client panics inside a `put` (the saver running it must survive).
    SaverPanic,
    /// A page finds the save queue full and is shed (R22).
    SaveQueueFull,
    /// A load or a save batch finds no staging memory.
    StagingExhausted,
    /// The lookup planner panics while it starts a lookup (it answers that lookup with
    /// nothing and goes on).
    PlannerPanic,
    /// The reservation manager panics while it starts a load (it retires: that load and
    /// every later one fail).
    ManagerPanic,
    /// The stats reporter panics as a collection starts (it carries on with the collection).
    ReporterPanic,
}

impl FaultPoint {
    /// Every point, in spec order.
    pub const ALL: [FaultPoint; 20] = [
        Self::ExistsBatch,
        Self::Exists,
        Self::PutBatch,
        Self::Put,
        Self::GetBatch,
        Self::Get,
        Self::TouchBatch,
        Self::Touch,
        Self::Evict,
        Self::CorruptHeader,
        Self::CorruptPayload,
        Self::Slow,
        Self::Timeout,
        Self::LoaderPanic,
        Self::SaverPanic,
        Self::SaveQueueFull,
        Self::StagingExhausted,
        Self::PlannerPanic,
        Self::ManagerPanic,
        Self::ReporterPanic,
    ];

    /// The spec name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::ExistsBatch => "exists_batch",
            Self::Exists => "exists",
            Self::PutBatch => "put_batch",
            Self::Put => "put",
            Self::GetBatch => "get_batch",
            Self::Get => "get",
            Self::TouchBatch => "touch_batch",
            Self::Touch => "touch",
            Self::Evict => "evict",
            Self::CorruptHeader => "corrupt_header",
            Self::CorruptPayload => "corrupt_payload",
            Self::Slow => "slow",
            Self::Timeout => "timeout",
            Self::LoaderPanic => "loader_panic",
            Self::SaverPanic => "saver_panic",
            Self::SaveQueueFull => "save_queue_full",
            Self::StagingExhausted => "staging_exhausted",
            Self::PlannerPanic => "planner_panic",
            Self::ManagerPanic => "manager_panic",
            Self::ReporterPanic => "reporter_panic",
        }
    }

    /// The point of a spec name.
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|point| point.as_str() == name)
    }

    /// Whether [`FaultyPool`](super::FaultyPool) fires it (otherwise an actor does).
    pub fn is_pool(self) -> bool {
        !matches!(
            self,
            Self::SaveQueueFull
                | Self::StagingExhausted
                | Self::PlannerPanic
                | Self::ManagerPanic
                | Self::ReporterPanic
        )
    }

    /// The rate `--faults default` gives it: modest, so a replay still reuses most of what
    /// it could. Per-key points are lower than per-batch ones since a load has many keys.
    pub fn modest_rate(self) -> f64 {
        match self {
            Self::Exists | Self::Get | Self::Evict | Self::CorruptHeader | Self::CorruptPayload => {
                0.000_05
            }
            // A planner panic costs one lookup's reuse, a reporter panic nothing.
            Self::Put | Self::Touch | Self::PlannerPanic | Self::ReporterPanic => 0.001,
            Self::ExistsBatch
            | Self::PutBatch
            | Self::TouchBatch
            | Self::StagingExhausted
            | Self::SaveQueueFull => 0.002,
            // A load is one get batch, so these fire rarely at 0.002; 0.005 makes a whole
            // soak see a few of each.
            Self::GetBatch | Self::Timeout | Self::LoaderPanic | Self::SaverPanic => 0.005,
            // Per step's loads: it retires the manager, so every later load of that
            // connector fails; rare enough that a soak mostly runs with one.
            Self::ManagerPanic => 0.000_1,
            Self::Slow => 0.01,
        }
    }

    pub(super) fn index(self) -> usize {
        self as usize
    }
}

/// Why a fault spec was refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum FaultSpecError {
    /// An entry is not `name=value`.
    #[error("fault spec entry {entry:?} is not name=value; get=0.01 works")]
    Entry {
        /// The entry.
        entry: String,
    },
    /// A name that is neither a fault point nor `seed` / `slow_ms`.
    #[error("unknown fault {name:?}; known: {known}, seed, slow_ms")]
    UnknownFault {
        /// The name.
        name: String,
        /// Every point name.
        known: String,
    },
    /// A rate outside `[0, 1]` or not a number.
    #[error("fault rate {value:?} of {name} is not a number in [0, 1]; 0.01 works")]
    Rate {
        /// The point.
        name: &'static str,
        /// The value.
        value: String,
    },
    /// `seed` or `slow_ms` is not an unsigned integer.
    #[error("fault parameter {name} = {value:?} is not an unsigned integer; {name}=7 works")]
    Parameter {
        /// `seed` or `slow_ms`.
        name: &'static str,
        /// The value.
        value: String,
    },
}

impl FaultSpecError {
    /// A short, stable label for metrics and logs.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Entry { .. } => "entry",
            Self::UnknownFault { .. } => "unknown_fault",
            Self::Rate { .. } => "rate",
            Self::Parameter { .. } => "parameter",
        }
    }
}

/// Rates of every point, the seed and the slow-answer delay.
#[derive(Clone, Debug, PartialEq)]
pub struct FaultSpec {
    rates: [f64; FaultPoint::ALL.len()],
    /// Seed of every decision.
    pub seed: u64,
    /// How late a [`FaultPoint::Slow`] answer is, in milliseconds.
    pub slow_ms: u64,
}

impl Default for FaultSpec {
    /// Every rate 0, seed 0, `slow_ms` 2.
    fn default() -> Self {
        Self {
            rates: [0.0; FaultPoint::ALL.len()],
            seed: 0,
            slow_ms: 2,
        }
    }
}

impl FaultSpec {
    /// Every point at its [`FaultPoint::modest_rate`].
    pub fn modest() -> Self {
        let mut spec = Self::default();
        for point in FaultPoint::ALL {
            spec.rates[point.index()] = point.modest_rate();
        }
        spec
    }

    /// Parses `name=value,...`; an entry `default` starts from [`modest`](Self::modest)
    /// (later entries override it: `default,seed=9,loader_panic=0`).
    ///
    /// # Errors
    ///
    /// [`FaultSpecError`] naming the entry, the unknown fault or the bad value.
    pub fn parse(text: &str) -> Result<Self, FaultSpecError> {
        let mut spec = Self::default();
        for entry in text
            .split(',')
            .map(str::trim)
            .filter(|entry| !entry.is_empty())
        {
            if entry == "default" {
                let (seed, slow_ms) = (spec.seed, spec.slow_ms);
                spec = Self {
                    seed,
                    slow_ms,
                    ..Self::modest()
                };
                continue;
            }
            let Some((name, value)) = entry.split_once('=') else {
                return Err(FaultSpecError::Entry {
                    entry: entry.to_owned(),
                });
            };
            let (name, value) = (name.trim(), value.trim());
            match name {
                "seed" => spec.seed = parse_parameter("seed", value)?,
                "slow_ms" => spec.slow_ms = parse_parameter("slow_ms", value)?,
                _ => {
                    let point = FaultPoint::from_name(name).ok_or_else(|| {
                        FaultSpecError::UnknownFault {
                            name: name.to_owned(),
                            known: FaultPoint::ALL.map(FaultPoint::as_str).join(", "),
                        }
                    })?;
                    spec.set_rate(point, parse_rate(point, value)?);
                }
            }
        }
        Ok(spec)
    }

    /// The rate of `point`.
    pub fn rate(&self, point: FaultPoint) -> f64 {
        self.rates[point.index()]
    }

    /// Sets the rate of `point` (clamped into `[0, 1]`).
    pub fn set_rate(&mut self, point: FaultPoint, rate: f64) {
        self.rates[point.index()] = rate.clamp(0.0, 1.0);
    }

    /// This spec with `point` at `rate`.
    #[must_use]
    pub fn with(mut self, point: FaultPoint, rate: f64) -> Self {
        self.set_rate(point, rate);
        self
    }
}

fn parse_rate(point: FaultPoint, value: &str) -> Result<f64, FaultSpecError> {
    value
        .parse::<f64>()
        .ok()
        .filter(|rate| (0.0..=1.0).contains(rate))
        .ok_or_else(|| FaultSpecError::Rate {
            name: point.as_str(),
            value: value.to_owned(),
        })
}

fn parse_parameter(name: &'static str, value: &str) -> Result<u64, FaultSpecError> {
    value.parse().map_err(|_| FaultSpecError::Parameter {
        name,
        value: value.to_owned(),
    })
}
