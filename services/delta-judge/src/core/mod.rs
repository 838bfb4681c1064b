//! The delta judge's pure logic: no transport types here.

pub mod asks;
pub mod consistency;
pub mod readability;
pub mod verify;
