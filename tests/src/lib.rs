//! Whole-mesh and external-client tests for Assay.
