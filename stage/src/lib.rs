//! Flotilla's staging program as a library: it downloads a model from `hf://`, `s3://` or
//! `oci://` into a directory, resumes interrupted downloads, verifies every file's size and
//! SHA-256, and writes a manifest whose digest the ModelCache controller compares — success is
//! reported only for a complete, verified set. The shared result types live in
//! `flotilla_apis::stage`; the binary (`src/main.rs`) adds flags, output and exit codes.

pub mod aws_auth;
pub mod download;
pub mod error;
pub mod hf;
pub mod http;
pub mod oci;
pub mod run;
pub mod s3;
pub mod s3_xml;
pub mod safe;
pub mod source;

pub use aws_auth::{Credentials, S3Auth};
pub use error::StageError;
pub use http::RetryPolicy;
pub use run::{Options, run, write_result};
pub use source::SourceConfig;
