//! The delta judge's pure logic: no transport types here.

pub mod readability;
pub mod verify;
