//! The arbiter's pure logic: no transport types here.

pub mod alpha;
