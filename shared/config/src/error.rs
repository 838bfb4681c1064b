//! What a configuration that cannot be used reports, naming the key.

/// Configuration errors.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("configuration error: {0}")]
    Invalid(#[from] config::ConfigError),
    /// One key's value is unusable.
    #[error("configuration error: {key}: {message}")]
    Key { key: &'static str, message: String },
    /// One rate of a backend's price table is unusable.
    #[error("configuration error: backends.{backend}.prices.{model:?}.{field}: {message}")]
    Price { backend: String, model: String, field: &'static str, message: String },
    /// One setting of a backend is unusable.
    #[error("configuration error: backends.{backend}.{key}: {message}")]
    Backend { backend: String, key: &'static str, message: String },
}
