//! The report stage: the typed `faultscope/1` report (`schema`), built from
//! the kernel's counts (`build`), shown as text (`text`, `live`), read back
//! (`file`) and judged (`findings`, `diff`, `verify`); a bench series
//! (`bench_series`, `bench --runs`) and its changelog text (`changelog`,
//! in the cover letter's layout: `cover_letter`).

pub mod attribution;
pub mod bench_series;
pub mod build;
pub mod changelog;
pub mod cover_letter;
pub mod diff;
pub mod file;
pub mod findings;
pub mod live;
pub mod metrics;
pub mod pprof;
pub mod provenance;
pub mod schema;
pub mod text;
pub mod verify;
