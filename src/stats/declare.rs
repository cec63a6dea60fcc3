//! How a counter is declared: once, with its name, help, kind and metric family, in a
//! [`counter_set!`] block that also declares the struct field it lives in.
//!
//! From that one declaration the macro derives everything that reads the counter: `merge`
//! (interval into totals), `since` (a sample minus an earlier one), `readings` (every value
//! with its declaration, for the metrics endpoint and the Python package), `Serialize` (the
//! Python dict and the replay's report) and `log` (the stats reporter's line). A new
//! counter is therefore one line in a set plus its increments; a new metric family is one
//! entry in [`crate::stats::families::FAMILIES`].
//!
//! - `stats::D1`. Every counter a set declares appears, in declaration order, in its
//!   `COUNTERS`, in `readings`, in its serialized map and in its log line, under the field's
//!   name.
//! - `stats::D2`. A counter names at most one family, and a labelled family's members each
//!   name a label value (checked for every declared counter by a unit test).

use super::families::{Family, FamilyType, FAMILIES};

/// How two values of one counter combine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CounterKind {
    /// Counts that add up (per interval, over actors and ranks).
    Sum,
    /// A high-water mark: the larger value wins.
    Max,
    /// Computed from the stored counters, never stored or merged.
    Derived,
}

impl CounterKind {
    /// Folds `other` into `value`.
    pub fn merge(self, value: &mut u64, other: u64) {
        match self {
            Self::Sum => *value = value.saturating_add(other),
            Self::Max => *value = (*value).max(other),
            Self::Derived => {}
        }
    }

    /// What `now` adds over `earlier`: the increase of a sum, the current mark of a max.
    pub fn since(self, now: u64, earlier: u64) -> u64 {
        match self {
            Self::Sum => now.saturating_sub(earlier),
            Self::Max | Self::Derived => now,
        }
    }

    /// The kind's name for the Python package (`sum`, `max`, `derived`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Sum => "sum",
            Self::Max => "max",
            Self::Derived => "derived",
        }
    }
}

/// One counter's declaration.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CounterDecl {
    /// The field's name: the key in logs, the Python dict and the replay's report.
    pub name: &'static str,
    /// The field's doc comment.
    pub help: &'static str,
    /// How values combine.
    pub kind: CounterKind,
    /// The metric family it is exposed in (`stats::families`), if any.
    pub family: Option<&'static str>,
    /// Its value of the family's label, for a labelled family.
    pub label_value: Option<&'static str>,
}

impl CounterDecl {
    /// The help text on one line.
    pub fn help_line(&self) -> String {
        self.help.split_whitespace().collect::<Vec<_>>().join(" ")
    }

    /// The counter or gauge family it is exposed in (a histogram family may share its
    /// name), if any.
    pub fn metric_family(&self) -> Option<&'static Family> {
        let name = self.family?;
        FAMILIES
            .iter()
            .find(|family| family.name == name && family.kind != FamilyType::Histogram)
    }
}

/// One latency histogram's declaration.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LatencyDecl {
    /// The field's name; serialized as `<name>_us`.
    pub name: &'static str,
    /// The field's doc comment.
    pub help: &'static str,
    /// The histogram family it is exposed in.
    pub family: &'static str,
}

/// The `tracing` target of the stats reporter's lines (logging filters name it).
pub const REPORT_TARGET: &str = "kv_connector::actors::stats_reporter";

/// Declares a set of counters: the struct, its fields and every reader (module docs).
///
/// ```text
/// counter_set! {
///     #[derive(Clone, Debug, Default, PartialEq)]
///     pub struct LookupStats in "lookups" {
///         extra {}
///         counters {
///             /// Outcome `full`.
///             full: Sum => "lookup_outcomes" / "full";
///             /// Lookups a full mailbox deferred.
///             deferred: Sum;
///         }
///         derived {
///             /// Lookups that ended with an outcome.
///             lookups = |s: &Self| s.full;
///         }
///         latencies {
///             /// Time spent probing per lookup.
///             probe_time => "lookup_probe";
///         }
///     }
/// }
/// ```
///
/// `extra` holds plain fields that are not counters (serialized and logged first, merged
/// by the set's own `merge`); sets without extra fields get `merge` generated.
macro_rules! counter_set {
    (
        $(#[$meta:meta])*
        pub struct $set:ident in $section:literal {
            extra { $( $(#[$xmeta:meta])* pub $xfield:ident : $xty:ty, )* }
            counters { $(
                $(#[doc = $doc:literal])*
                $field:ident : $kind:ident $(=> $family:literal $(/ $value:literal)?)? ;
            )* }
            derived { $(
                $(#[doc = $ddoc:literal])*
                $dname:ident = $dfn:expr $(=> $dfamily:literal $(/ $dvalue:literal)?)? ;
            )* }
            latencies { $(
                $(#[doc = $ldoc:literal])*
                $lfield:ident => $lfamily:literal ;
            )* }
        }
    ) => {
        $(#[$meta])*
        pub struct $set {
            $( $(#[$xmeta])* pub $xfield: $xty, )*
            $( $(#[doc = $doc])* pub $field: u64, )*
            $( $(#[doc = $ldoc])* pub $lfield: $crate::stats::Latency, )*
        }

        impl $set {
            /// The set's name: its key in the Python dict and its log line's message.
            pub const SECTION: &'static str = $section;

            /// Every counter of the set, stored ones first, then derived ones.
            pub const COUNTERS: &'static [$crate::stats::CounterDecl] = &[
                $( $crate::stats::CounterDecl {
                    name: stringify!($field),
                    help: concat!($($doc, "\n",)* ""),
                    kind: $crate::stats::CounterKind::$kind,
                    family: counter_set!(@opt $($family)?),
                    label_value: counter_set!(@opt $($($value)?)?),
                }, )*
                $( $crate::stats::CounterDecl {
                    name: stringify!($dname),
                    help: concat!($($ddoc, "\n",)* ""),
                    kind: $crate::stats::CounterKind::Derived,
                    family: counter_set!(@opt $($dfamily)?),
                    label_value: counter_set!(@opt $($($dvalue)?)?),
                }, )*
            ];

            /// Every latency histogram of the set.
            pub const LATENCIES: &'static [$crate::stats::LatencyDecl] = &[
                $( $crate::stats::LatencyDecl {
                    name: stringify!($lfield),
                    help: concat!($($ldoc, "\n",)* ""),
                    family: $lfamily,
                }, )*
            ];

            /// Every counter's value with its declaration, in `COUNTERS` order.
            pub fn readings(
                &self,
            ) -> impl Iterator<Item = (&'static $crate::stats::CounterDecl, u64)> {
                let values = [$( self.$field, )* $( ($dfn)(self), )*];
                Self::COUNTERS.iter().zip(values)
            }

            /// Every latency histogram with its declaration, in `LATENCIES` order.
            pub fn latencies(
                &self,
            ) -> impl Iterator<Item = (&'static $crate::stats::LatencyDecl, &$crate::stats::Latency)> {
                let histograms: [&$crate::stats::Latency; counter_set!(@count $($lfield)*)] =
                    [$( &self.$lfield, )*];
                Self::LATENCIES.iter().zip(histograms)
            }

            /// Folds another interval's counters and histograms into these (extra fields
            /// are the set's own business).
            pub fn merge_counters(&mut self, other: &Self) {
                $( $crate::stats::CounterKind::$kind.merge(&mut self.$field, other.$field); )*
                $( self.$lfield.merge(&other.$lfield); )*
            }

            /// What this sample counted since `earlier` (an older sample of the same
            /// totals): sums as increases, marks and extra fields as they are now,
            /// histograms empty.
            #[must_use]
            pub fn since(&self, earlier: &Self) -> Self {
                Self {
                    $( $xfield: self.$xfield.clone(), )*
                    $( $field: $crate::stats::CounterKind::$kind.since(self.$field, earlier.$field), )*
                    $( $lfield: $crate::stats::Latency::default(), )*
                }
            }

            /// Logs the set at INFO on the report's target, one `key=value` field per
            /// counter (latencies as `p50/p99/max` microseconds).
            pub fn log(&self, instance: &str) {
                tracing::info!(
                    target: $crate::stats::REPORT_TARGET,
                    instance,
                    $( $xfield = %self.$xfield, )*
                    $( $field = self.$field, )*
                    $( $dname = ($dfn)(self), )*
                    $( $lfield = %self.$lfield.summary(), )*
                    $section
                );
            }
        }

        impl serde::Serialize for $set {
            fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                use serde::ser::SerializeMap;
                let mut map = serializer.serialize_map(None)?;
                $( map.serialize_entry(stringify!($xfield), &self.$xfield)?; )*
                for (counter, value) in self.readings() {
                    map.serialize_entry(counter.name, &value)?;
                }
                $( map.serialize_entry(concat!(stringify!($lfield), "_us"), &self.$lfield.summary())?; )*
                map.end()
            }
        }
    };
    (@count $($item:ident)*) => { <[()]>::len(&[$(counter_set!(@unit $item)),*]) };
    (@unit $item:ident) => { () };
    (@opt) => { None };
    (@opt $value:literal) => { Some($value) };
}

pub(crate) use counter_set;
