//! Decisions and masks.

use std::fmt;

/// What a principal sees of a column.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Decision {
    /// The decrypted value.
    Plaintext,
    /// A masked value (the column keeps its name).
    Mask(Mask),
    /// The column is absent for this principal (`SELECT *`, `DESCRIBE`); naming it fails.
    Hide,
    /// Any query naming the column fails before reading data.
    Deny,
}

/// Masks, named as in Iceberg REST `ReadRestrictions` where it has a name.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Mask {
    /// Typed NULL (`replace_with_null`, Ranger `MASK_NULL`).
    Null,
    /// A constant of the column's type (`mask_to_fixed_value`, Ranger `MASK`); `None` = the
    /// type's default: `****` for strings, 0, 1970-01-01, the epoch, false, an empty list.
    Fixed(Option<String>),
    /// Letters and digits replaced by `X` except the last 4 characters (`show_last_4`).
    #[serde(rename = "show_last_4")]
    ShowLast4,
    /// Letters and digits replaced by `X` except the first 4 characters (`show_first_4`).
    #[serde(rename = "show_first_4")]
    ShowFirst4,
    /// Lowercase hex SHA-256 of the value's text, **unkeyed** (same value, same hash, in
    /// every query: joinable, but guessable for small domains) (`sha256_global`).
    Sha256,
    /// Lowercase hex HMAC-SHA256 of the value's text under the policy's secret
    /// (`[masks] hmac_key_file`): the same value gives the same hash in every query of
    /// every principal under one policy (joinable), but nobody without the secret can
    /// confirm a guess by hashing it.
    #[serde(rename = "hmac_sha256")]
    HmacSha256,
    /// Date or timestamp truncated to January 1st of its year (`truncate_to_year`).
    TruncateToYear,
    /// Date or timestamp truncated to the first of its month (`truncate_to_month`).
    TruncateToMonth,
    /// An action a REST catalog's read restrictions require, with the exact semantics
    /// of the Iceberg REST spec (`crate::restrictions`); not written in policy files.
    Catalog(CatalogMask),
}

/// The Iceberg REST spec's column actions that ClearIce's own masks do not already
/// compute exactly (`replace-with-null`, `truncate-to-year` and `truncate-to-month` are
/// [`Mask::Null`], [`Mask::TruncateToYear`] and [`Mask::TruncateToMonth`]). Each keeps
/// the column's type, and NULL stays NULL.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CatalogMask {
    /// `mask-alphanum`: per code point, digits to `n`, `( ) , . - @` kept, all else `x`.
    MaskAlphanum,
    /// `show-first-4`: the first 4 code points kept, the rest as `mask-alphanum`.
    ShowFirst4,
    /// `show-last-4`: the last 4 code points kept, the rest as `mask-alphanum`.
    ShowLast4,
    /// `mask-to-default`: the spec's fixed default of the column's type (999999999 for
    /// integers, `XXXXXXXX` for strings, 9999-12-31 for dates...); NULL stays NULL.
    MaskToDefault,
    /// `sha-256-global`: SHA-256 of the value's canonical bytes (UTF-8, 4 or 8 bytes
    /// little-endian, raw), given back in the column's type (hex text, the digest's first
    /// 4 or 8 bytes as a little-endian integer, the digest).
    Sha256Global,
}

impl CatalogMask {
    /// The spec's action name.
    pub fn name(self) -> &'static str {
        match self {
            CatalogMask::MaskAlphanum => "mask-alphanum",
            CatalogMask::ShowFirst4 => "show-first-4",
            CatalogMask::ShowLast4 => "show-last-4",
            CatalogMask::MaskToDefault => "mask-to-default",
            CatalogMask::Sha256Global => "sha-256-global",
        }
    }
}

impl Mask {
    /// Whether the mask is computed from the value (so the column must be decrypted).
    pub fn needs_value(&self) -> bool {
        // `mask-to-default` keeps NULL as NULL, so it reads the column too.
        !matches!(self, Mask::Null | Mask::Fixed(_))
    }

    /// The policy-file name.
    pub fn name(&self) -> &'static str {
        match self {
            Mask::Null => "null",
            Mask::Fixed(_) => "fixed",
            Mask::ShowLast4 => "show_last_4",
            Mask::ShowFirst4 => "show_first_4",
            Mask::Sha256 => "sha256",
            Mask::HmacSha256 => "hmac_sha256",
            Mask::TruncateToYear => "truncate_to_year",
            Mask::TruncateToMonth => "truncate_to_month",
            Mask::Catalog(c) => c.name(),
        }
    }

    /// Whether the mask applies to a column of this kind.
    pub fn applies_to(&self, kind: ColumnKind) -> bool {
        match self {
            Mask::Null | Mask::Fixed(_) | Mask::Sha256 | Mask::HmacSha256 => true,
            Mask::ShowLast4 | Mask::ShowFirst4 => kind == ColumnKind::String,
            Mask::TruncateToYear | Mask::TruncateToMonth => {
                matches!(kind, ColumnKind::Date | ColumnKind::Timestamp)
            }
            Mask::Catalog(
                CatalogMask::MaskAlphanum | CatalogMask::ShowFirst4 | CatalogMask::ShowLast4,
            ) => kind == ColumnKind::String,
            Mask::Catalog(CatalogMask::MaskToDefault) => kind != ColumnKind::Other,
            Mask::Catalog(CatalogMask::Sha256Global) => {
                matches!(
                    kind,
                    ColumnKind::String | ColumnKind::Numeric | ColumnKind::Other
                )
            }
        }
    }
}

impl Decision {
    /// Whether the engine must decrypt the column to produce what the principal sees.
    pub fn needs_value(&self) -> bool {
        match self {
            Decision::Plaintext => true,
            Decision::Mask(m) => m.needs_value(),
            Decision::Hide | Decision::Deny => false,
        }
    }

    /// Name as written in the policy file.
    pub fn name(&self) -> &'static str {
        match self {
            Decision::Plaintext => "plaintext",
            Decision::Mask(m) => m.name(),
            Decision::Hide => "hide",
            Decision::Deny => "deny",
        }
    }

    /// Permissiveness rank: a user with several roles gets the most permissive decision.
    pub fn rank(&self) -> u8 {
        match self {
            Decision::Plaintext => 10,
            Decision::Mask(Mask::TruncateToMonth) => 9,
            Decision::Mask(Mask::TruncateToYear) => 8,
            Decision::Mask(
                Mask::ShowFirst4
                | Mask::ShowLast4
                | Mask::Catalog(CatalogMask::ShowFirst4 | CatalogMask::ShowLast4),
            ) => 7,
            // An unkeyed hash can be confirmed by guessing; a keyed one cannot.
            Decision::Mask(Mask::Sha256 | Mask::Catalog(CatalogMask::Sha256Global)) => 6,
            Decision::Mask(Mask::HmacSha256) => 5,
            Decision::Mask(Mask::Catalog(CatalogMask::MaskAlphanum)) => 4,
            Decision::Mask(Mask::Fixed(_) | Mask::Catalog(CatalogMask::MaskToDefault)) => 4,
            Decision::Mask(Mask::Null) => 3,
            Decision::Hide => 2,
            Decision::Deny => 1,
        }
    }

    /// The decision under two independent rules that must both hold (the local policy's
    /// and a REST catalog's read restriction): deny, then hide, over anything; one side's
    /// mask over the other's plaintext; and two different masks give NULL, which shows no
    /// more than either (both keep NULL as NULL).
    pub fn stricter(self, other: Decision) -> Decision {
        match (self, other) {
            (Decision::Deny, _) | (_, Decision::Deny) => Decision::Deny,
            (Decision::Hide, _) | (_, Decision::Hide) => Decision::Hide,
            (Decision::Plaintext, d) | (d, Decision::Plaintext) => d,
            (Decision::Mask(a), Decision::Mask(b)) if a == b => Decision::Mask(a),
            (Decision::Mask(_), Decision::Mask(_)) => Decision::Mask(Mask::Null),
        }
    }
}

impl fmt::Display for Decision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Decision::Mask(Mask::Fixed(Some(v))) => write!(f, "fixed({v:?})"),
            d => f.write_str(d.name()),
        }
    }
}

/// Whether a principal may read a table at all (`[tables."c.n.t"] access`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TableDecision {
    /// The table is listed and readable (columns still go through their rules).
    Allow,
    /// The table is listed, but any query naming it fails before reading data.
    Deny,
    /// The table is not listed, and naming it fails as for a table that does not exist.
    Hide,
}

impl TableDecision {
    /// Name as written in the policy file.
    pub fn name(self) -> &'static str {
        match self {
            TableDecision::Allow => "allow",
            TableDecision::Deny => "deny",
            TableDecision::Hide => "hide",
        }
    }

    /// Parses a policy-file name.
    pub fn parse(name: &str) -> Option<Self> {
        Some(match name {
            "allow" => TableDecision::Allow,
            "deny" => TableDecision::Deny,
            "hide" => TableDecision::Hide,
            _ => return None,
        })
    }

    /// Permissiveness rank (a denied table is at least known to exist).
    pub fn rank(self) -> u8 {
        match self {
            TableDecision::Allow => 3,
            TableDecision::Deny => 2,
            TableDecision::Hide => 1,
        }
    }
}

/// Kind of a column, for checking that a mask applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ColumnKind {
    /// Strings.
    String,
    /// Integers, floats, decimals.
    Numeric,
    /// Dates.
    Date,
    /// Timestamps.
    Timestamp,
    /// Booleans.
    Boolean,
    /// Lists, structs, maps.
    Nested,
    /// Anything else (binary, time...).
    Other,
}

/// What to do when the KMS lacks or refuses the key a rule needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MissingKey {
    /// The query fails, naming the column and key (default).
    #[default]
    Error,
    /// The column reads as NULL.
    Null,
    /// The column reads as the type's fixed constant.
    Fixed,
    /// The column is hidden.
    Hide,
}

/// Where a decision came from (shown in errors, EXPLAIN and the audit log).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RuleSource {
    /// A `user:NAME` rule.
    User(String),
    /// A role rule.
    Role(String),
    /// The `*` rule.
    Wildcard,
    /// A tag's rule (`[tags.NAME]`): the strictest of the column's tags, for a column
    /// without a rule of its own for the principal; the tag and the rule within it.
    Tag {
        /// Tag name.
        tag: String,
        /// The rule within the tag (`user:NAME`, `role:NAME`, `*`, or none matched).
        rule: Box<RuleSource>,
    },
    /// No rule matched a protected column: denied.
    DefaultProtected,
    /// No rule matched an unprotected column: plaintext.
    DefaultUnprotected,
    /// The key was missing and `on_missing_key` applied.
    MissingKey(String),
    /// The principal is not in the policy.
    UnknownPrincipal,
    /// The crypto provider refused the principal the column's key (`on_missing_key`
    /// applied).
    ProviderDenied {
        /// Provider name.
        provider: String,
        /// Master key id.
        key: String,
    },
    /// A REST catalog's read restriction for the column, combined with the local rule
    /// (the stricter wins, [`Decision::stricter`]).
    Catalog {
        /// The catalog's action (`mask-alphanum`, `replace-with-null`...).
        action: String,
        /// The local policy's rule.
        local: Box<RuleSource>,
    },
}

impl fmt::Display for RuleSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RuleSource::User(u) => write!(f, "user:{u}"),
            RuleSource::Role(r) => write!(f, "role:{r}"),
            RuleSource::Wildcard => f.write_str("*"),
            RuleSource::Tag { tag, rule } => write!(f, "tag:{tag} ({rule})"),
            RuleSource::DefaultProtected => f.write_str("default (protected column)"),
            RuleSource::DefaultUnprotected => f.write_str("default (unprotected column)"),
            RuleSource::MissingKey(k) => write!(f, "on_missing_key (key '{k}' unavailable)"),
            RuleSource::UnknownPrincipal => f.write_str("unknown principal"),
            RuleSource::ProviderDenied { provider, key } => {
                write!(f, "denied by crypto provider '{provider}' (key '{key}')")
            }
            RuleSource::Catalog { action, local } => {
                write!(f, "catalog read restriction '{action}' with {local}")
            }
        }
    }
}

/// A decision with its source.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resolved {
    /// The decision.
    pub decision: Decision,
    /// The rule that made it.
    pub rule: RuleSource,
}
