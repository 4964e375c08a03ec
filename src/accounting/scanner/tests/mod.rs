//! Exact-sequence tests of the scanners, one module per API, on bodies
//! shaped as vLLM writes them. Streams are cut at every byte boundary.

use super::*;

mod completions;
