//! The `kv-connector` subcommands.
