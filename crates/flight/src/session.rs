//! Flight session options (`SetSessionOptions`, `GetSessionOptions`, `CloseSession`
//! actions of Flight.proto): the catalog and schema unqualified names resolve in.
//!
//! A session is tied to the bearer token of the Handshake that opened it, so every
//! connection of the JDBC driver or ADBC (each logs in once) has its own; no cookie is
//! needed. arrow-flight 58 has no types for these messages: they are declared here with
//! Flight.proto's field numbers.

use std::collections::HashMap;
use std::sync::Mutex;

/// `SessionOptionValue`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct SessionOptionValue {
    /// The value; none = unset the option.
    #[prost(oneof = "OptionValue", tags = "1, 2, 3, 4, 5")]
    pub option_value: Option<OptionValue>,
}

/// `SessionOptionValue.option_value`.
#[derive(Clone, PartialEq, prost::Oneof)]
pub enum OptionValue {
    /// `string_value`.
    #[prost(string, tag = "1")]
    StringValue(String),
    /// `bool_value`.
    #[prost(bool, tag = "2")]
    BoolValue(bool),
    /// `int64_value`.
    #[prost(sfixed64, tag = "3")]
    Int64Value(i64),
    /// `double_value`.
    #[prost(double, tag = "4")]
    DoubleValue(f64),
    /// `string_list_value`.
    #[prost(message, tag = "5")]
    StringListValue(StringListValue),
}

/// `SessionOptionValue.StringListValue`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct StringListValue {
    /// Values.
    #[prost(string, repeated, tag = "1")]
    pub values: Vec<String>,
}

/// `SetSessionOptionsRequest`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct SetSessionOptionsRequest {
    /// Options to set.
    #[prost(map = "string, message", tag = "1")]
    pub session_options: HashMap<String, SessionOptionValue>,
}

/// `SetSessionOptionsResult.ErrorValue`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, prost::Enumeration)]
#[repr(i32)]
pub enum SetSessionOptionsError {
    /// Unknown.
    Unspecified = 0,
    /// The option name is not known.
    InvalidName = 1,
    /// The value or its type is not valid.
    InvalidValue = 2,
    /// The option cannot be set.
    Error = 3,
}

/// `SetSessionOptionsResult.Error`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct SetSessionOptionsErrorValue {
    /// The error.
    #[prost(enumeration = "SetSessionOptionsError", tag = "1")]
    pub value: i32,
}

/// `SetSessionOptionsResult`: only options that were not set are listed.
#[derive(Clone, PartialEq, prost::Message)]
pub struct SetSessionOptionsResult {
    /// Errors by option name.
    #[prost(map = "string, message", tag = "1")]
    pub errors: HashMap<String, SetSessionOptionsErrorValue>,
}

/// `GetSessionOptionsResult`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct GetSessionOptionsResult {
    /// Current options.
    #[prost(map = "string, message", tag = "1")]
    pub session_options: HashMap<String, SessionOptionValue>,
}

/// `CloseSessionResult.Status`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, prost::Enumeration)]
#[repr(i32)]
pub enum CloseSessionStatus {
    /// Unknown.
    Unspecified = 0,
    /// Closed.
    Closed = 1,
    /// Closing.
    Closing = 2,
    /// Not closeable.
    NotCloseable = 3,
}

/// `CloseSessionResult`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct CloseSessionResult {
    /// Status.
    #[prost(enumeration = "CloseSessionStatus", tag = "1")]
    pub status: i32,
}

/// Option names a session understands.
pub const CATALOG: &str = "catalog";
/// See [`CATALOG`].
pub const SCHEMA: &str = "schema";

/// The options of one session.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SessionOptions {
    /// Default catalog.
    pub catalog: Option<String>,
    /// Default schema.
    pub schema: Option<String>,
    /// Options set with `SET` in this session (allow-listed), applied to each call.
    pub settings: std::collections::BTreeMap<String, String>,
}

/// A `GetSessionOptionsResult` with the catalog and schema in effect.
pub fn options_result(catalog: &str, schema: &str) -> GetSessionOptionsResult {
    let value = |v: &str| SessionOptionValue {
        option_value: Some(OptionValue::StringValue(v.to_owned())),
    };
    GetSessionOptionsResult {
        session_options: HashMap::from([
            (CATALOG.to_owned(), value(catalog)),
            (SCHEMA.to_owned(), value(schema)),
        ]),
    }
}

/// Sessions by bearer token.
#[derive(Debug, Default)]
pub struct Sessions {
    by_token: Mutex<HashMap<String, SessionOptions>>,
}

impl Sessions {
    /// The options of a token's session (default if it has none).
    pub fn get(&self, token: &str) -> SessionOptions {
        self.by_token
            .lock()
            .expect("sessions")
            .get(token)
            .cloned()
            .unwrap_or_default()
    }

    /// Stores a token's options.
    pub fn set(&self, token: &str, options: SessionOptions) {
        self.by_token
            .lock()
            .expect("sessions")
            .insert(token.to_owned(), options);
    }

    /// Ends a token's session; whether it had one.
    pub fn close(&self, token: &str) -> bool {
        self.by_token
            .lock()
            .expect("sessions")
            .remove(token)
            .is_some()
    }

    /// Drops sessions whose token is no longer valid.
    pub fn retain(&self, valid: impl Fn(&str) -> bool) {
        self.by_token
            .lock()
            .expect("sessions")
            .retain(|t, _| valid(t));
    }
}
