//! AWS KMS as a [`Kms`]: KEKs wrapped with `Encrypt` and unwrapped with `Decrypt` under a
//! KMS key (id, ARN or alias), over the KMS JSON API signed with AWS Signature V4.
//!
//! Credentials and region come from the usual places, in this order: the environment
//! (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`, `AWS_REGION` /
//! `AWS_DEFAULT_REGION`, `AWS_ENDPOINT_URL_KMS` / `AWS_ENDPOINT_URL`), then the shared
//! files' profile (`AWS_PROFILE` or the configured one, else `default`;
//! `~/.aws/credentials`, `~/.aws/config`, or `AWS_SHARED_CREDENTIALS_FILE` /
//! `AWS_CONFIG_FILE`). Instance metadata and SSO are not read.
//!
//! The wrapped key stored in PME key material is the base64 `CiphertextBlob`, as
//! parquet-java's AWS KMS clients store it.

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Duration;

use base64::Engine;
use base64::prelude::BASE64_STANDARD;
use zeroize::Zeroizing;

use crate::error::{Error, Result};
use crate::kms::Kms;
use crate::secret::SecretKey;

/// Settings of the AWS KMS client; `None` fields come from the environment and profile.
#[derive(Debug, Clone, Default)]
pub struct AwsKmsConfig {
    /// Region, e.g. `eu-west-1`.
    pub region: Option<String>,
    /// Endpoint URL (an AWS-compatible KMS, a VPC endpoint).
    pub endpoint: Option<String>,
    /// Shared-files profile.
    pub profile: Option<String>,
    /// Per-call timeout.
    pub timeout: Option<Duration>,
}

#[derive(Clone)]
struct Credentials {
    access_key_id: String,
    secret: Zeroizing<String>,
    session_token: Option<Zeroizing<String>>,
}

/// The AWS KMS client (see the module docs).
pub struct AwsKms {
    region: String,
    endpoint: String,
    credentials: Credentials,
    timeout: Duration,
    /// One pooled HTTP client for every call (its connections are reused).
    client: reqwest::Client,
}

impl std::fmt::Debug for AwsKms {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AwsKms")
            .field("region", &self.region)
            .field("endpoint", &self.endpoint)
            .field("access_key_id", &self.credentials.access_key_id)
            .finish_non_exhaustive()
    }
}

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

/// Reads one profile section of an INI-style AWS shared file.
#[expect(
    clippy::disallowed_methods,
    reason = "startup: the KMS client is built on a blocking thread before serving"
)]
fn profile_section(path: &PathBuf, section: &str) -> HashMap<String, String> {
    let Ok(text) = std::fs::read_to_string(path) else {
        return HashMap::new();
    };
    let mut current = String::new();
    let mut out = HashMap::new();
    for line in text.lines() {
        let line = line.trim();
        if line.starts_with('#') || line.starts_with(';') || line.is_empty() {
            continue;
        }
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            current = name.trim().to_owned();
            continue;
        }
        if current == section
            && let Some((k, v)) = line.split_once('=')
        {
            out.insert(k.trim().to_owned(), v.trim().to_owned());
        }
    }
    out
}

/// AWS credentials and region from the standard environment variables and shared files
/// (`AWS_ACCESS_KEY_ID`/`AWS_SECRET_ACCESS_KEY`/`AWS_SESSION_TOKEN`, else the profile's
/// keys in `~/.aws/credentials`; `AWS_REGION`/`AWS_DEFAULT_REGION`, else the profile's
/// region in `~/.aws/config`). Used by the AWS KMS client and by S3 storage.
#[derive(Clone, Default)]
pub struct AwsEnvironment {
    /// Access key id.
    pub access_key_id: Option<String>,
    /// Secret access key.
    pub secret_access_key: Option<Zeroizing<String>>,
    /// Session token (temporary credentials).
    pub session_token: Option<Zeroizing<String>>,
    /// Region.
    pub region: Option<String>,
    /// The profile the shared files were read for.
    pub profile: String,
    /// The shared credentials file (named in messages).
    pub credentials_file: PathBuf,
}

impl std::fmt::Debug for AwsEnvironment {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AwsEnvironment")
            .field("access_key_id", &self.access_key_id)
            .field("region", &self.region)
            .field("profile", &self.profile)
            .finish_non_exhaustive()
    }
}

impl AwsEnvironment {
    /// Reads the environment and the shared files of `profile` (`AWS_PROFILE` wins;
    /// default `default`). Blocking: reads files.
    pub fn load(profile: Option<&str>) -> Self {
        let home = std::env::var_os("HOME")
            .map(PathBuf::from)
            .unwrap_or_default();
        let profile = env("AWS_PROFILE")
            .or_else(|| profile.map(str::to_owned))
            .unwrap_or_else(|| "default".into());
        let credentials_file = env("AWS_SHARED_CREDENTIALS_FILE")
            .map(PathBuf::from)
            .unwrap_or_else(|| home.join(".aws/credentials"));
        let config_file = env("AWS_CONFIG_FILE")
            .map(PathBuf::from)
            .unwrap_or_else(|| home.join(".aws/config"));
        let (access_key_id, secret_access_key, session_token) =
            match (env("AWS_ACCESS_KEY_ID"), env("AWS_SECRET_ACCESS_KEY")) {
                (Some(id), Some(secret)) => (
                    Some(id),
                    Some(Zeroizing::new(secret)),
                    env("AWS_SESSION_TOKEN").map(Zeroizing::new),
                ),
                _ => {
                    let mut p = profile_section(&credentials_file, &profile);
                    match (
                        p.remove("aws_access_key_id"),
                        p.remove("aws_secret_access_key"),
                    ) {
                        (Some(id), Some(secret)) => (
                            Some(id),
                            Some(Zeroizing::new(secret)),
                            p.remove("aws_session_token").map(Zeroizing::new),
                        ),
                        _ => (None, None, None),
                    }
                }
            };
        let config_section = if profile == "default" {
            "default".to_owned()
        } else {
            format!("profile {profile}")
        };
        let region = env("AWS_REGION")
            .or_else(|| env("AWS_DEFAULT_REGION"))
            .or_else(|| profile_section(&config_file, &config_section).remove("region"));
        Self {
            access_key_id,
            secret_access_key,
            session_token,
            region,
            profile,
            credentials_file,
        }
    }
}

impl AwsKms {
    /// Resolves credentials, region and endpoint (reads the shared files: blocking).
    pub fn new(config: &AwsKmsConfig) -> Result<Self> {
        let err = |reason: String| Error::KmsCall {
            kms: "aws".into(),
            key_id: String::new(),
            reason,
        };
        let aws = AwsEnvironment::load(config.profile.as_deref());
        let credentials = match (aws.access_key_id.clone(), aws.secret_access_key.clone()) {
            (Some(access_key_id), Some(secret)) => Credentials {
                access_key_id,
                secret,
                session_token: aws.session_token.clone(),
            },
            _ => {
                return Err(err(format!(
                    "no AWS credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or profile '{}' in {}",
                    aws.profile,
                    aws.credentials_file.display()
                )));
            }
        };
        let region = config.region.clone().or(aws.region).ok_or_else(|| {
            err("no AWS region: set `region` in [kms], AWS_REGION, or the profile's region".into())
        })?;
        let endpoint = config
            .endpoint
            .clone()
            .or_else(|| env("AWS_ENDPOINT_URL_KMS"))
            .or_else(|| env("AWS_ENDPOINT_URL"))
            .unwrap_or_else(|| format!("https://kms.{region}.amazonaws.com"));
        let endpoint = endpoint.trim_end_matches('/').to_owned();
        if !(endpoint.starts_with("https://") || endpoint.starts_with("http://")) {
            return Err(err(format!("endpoint '{endpoint}' is not http(s)://")));
        }
        let timeout = config.timeout.unwrap_or(Duration::from_secs(10));
        let client = reqwest::Client::builder()
            .use_rustls_tls()
            .timeout(timeout)
            .build()
            .map_err(|e| err(format!("HTTP client: {e}")))?;
        Ok(Self {
            region,
            endpoint,
            credentials,
            timeout,
            client,
        })
    }

    /// The endpoint called.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    fn host(&self) -> &str {
        let rest = self
            .endpoint
            .split_once("://")
            .map_or(self.endpoint.as_str(), |(_, r)| r);
        rest.split('/').next().unwrap_or(rest)
    }

    /// Signed headers of a KMS call at `now` (`YYYYMMDDTHHMMSSZ`).
    fn sign(&self, target: &str, body: &[u8], amz_date: &str) -> Vec<(String, String)> {
        let date = &amz_date[..8];
        let mut headers = vec![
            (
                "content-type".to_owned(),
                "application/x-amz-json-1.1".to_owned(),
            ),
            ("host".to_owned(), self.host().to_owned()),
            ("x-amz-date".to_owned(), amz_date.to_owned()),
        ];
        if let Some(t) = &self.credentials.session_token {
            headers.push(("x-amz-security-token".to_owned(), t.to_string()));
        }
        headers.push(("x-amz-target".to_owned(), format!("TrentService.{target}")));
        let authorization = sigv4(
            "POST",
            "/",
            "",
            &headers,
            body,
            &SigningScope {
                date,
                amz_date,
                region: &self.region,
                service: "kms",
            },
            &self.credentials.access_key_id,
            &self.credentials.secret,
        );
        headers.push(("authorization".to_owned(), authorization));
        headers.retain(|(k, _)| k != "host");
        headers
    }

    /// One KMS API call, through the pooled client.
    async fn call(
        &self,
        target: &str,
        key_id: &str,
        body: serde_json::Value,
    ) -> Result<serde_json::Value> {
        let err = |reason: String| Error::KmsCall {
            kms: "aws".into(),
            key_id: key_id.into(),
            reason,
        };
        let body = serde_json::to_vec(&body).expect("json");
        let amz_date = chrono::Utc::now().format("%Y%m%dT%H%M%SZ").to_string();
        let headers = self.sign(target, &body, &amz_date);
        let url = format!("{}/", self.endpoint);
        let timeout = self.timeout;
        let mut req = self.client.post(&url).body(body);
        for (k, v) in headers {
            req = req.header(k, v);
        }
        let resp = req.send().await.map_err(|e| {
            err(if e.is_timeout() {
                format!("{url}: no answer within {:.1} s", timeout.as_secs_f64())
            } else {
                let mut s: &dyn std::error::Error = &e;
                while let Some(next) = s.source() {
                    s = next;
                }
                format!("{url}: {s}")
            })
        })?;
        let status = resp.status().as_u16();
        let bytes = resp.bytes().await.map_err(|e| err(e.to_string()))?;
        let v: serde_json::Value = serde_json::from_slice(&bytes).unwrap_or_default();
        if status == 200 {
            return Ok(v);
        }
        let kind = v["__type"]
            .as_str()
            .unwrap_or_default()
            .rsplit('#')
            .next()
            .unwrap_or_default()
            .to_owned();
        let message = v["message"]
            .as_str()
            .or_else(|| v["Message"].as_str())
            .unwrap_or_default();
        match kind.as_str() {
            "NotFoundException" => Err(Error::UnknownMasterKey {
                kms: "aws".into(),
                key_id: key_id.into(),
            }),
            "InvalidCiphertextException" => Err(Error::Unwrap {
                kms: "aws".into(),
                key_id: key_id.into(),
            }),
            _ => Err(err(format!("HTTP {status} {kind}: {message}"))),
        }
    }
}

#[async_trait::async_trait]
impl Kms for AwsKms {
    fn name(&self) -> &str {
        "aws"
    }

    async fn wrap_key(&self, key: &[u8], master_key_id: &str) -> Result<String> {
        let v = self
            .call(
                "Encrypt",
                master_key_id,
                serde_json::json!({"KeyId": master_key_id, "Plaintext": BASE64_STANDARD.encode(key)}),
            )
            .await?;
        v["CiphertextBlob"]
            .as_str()
            .map(str::to_owned)
            .ok_or_else(|| Error::Wrap {
                kms: "aws".into(),
                key_id: master_key_id.into(),
            })
    }

    async fn unwrap_key(&self, wrapped: &str, master_key_id: &str) -> Result<SecretKey> {
        let v = self
            .call(
                "Decrypt",
                master_key_id,
                serde_json::json!({"KeyId": master_key_id, "CiphertextBlob": wrapped.trim()}),
            )
            .await?;
        let plain = Zeroizing::new(v["Plaintext"].as_str().unwrap_or_default().to_owned());
        BASE64_STANDARD
            .decode(plain.as_bytes())
            .ok()
            .filter(|k| matches!(k.len(), 16 | 24 | 32))
            .map(SecretKey::from_bytes)
            .ok_or_else(|| Error::Unwrap {
                kms: "aws".into(),
                key_id: master_key_id.into(),
            })
    }
}

/// Date and place of a signature.
struct SigningScope<'a> {
    date: &'a str,
    amz_date: &'a str,
    region: &'a str,
    service: &'a str,
}

fn hex_sha256(data: &[u8]) -> String {
    hex(ring::digest::digest(&ring::digest::SHA256, data).as_ref())
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn hmac(key: &[u8], data: &str) -> Vec<u8> {
    let k = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, key);
    ring::hmac::sign(&k, data.as_bytes()).as_ref().to_vec()
}

/// AWS Signature V4 `Authorization` value. `headers` are lower-case names, sorted by the
/// caller's order of signing (they are sorted here).
#[expect(clippy::too_many_arguments, reason = "the signature's inputs, named")]
fn sigv4(
    method: &str,
    path: &str,
    query: &str,
    headers: &[(String, String)],
    body: &[u8],
    scope: &SigningScope<'_>,
    access_key_id: &str,
    secret: &str,
) -> String {
    let mut sorted: Vec<_> = headers
        .iter()
        .map(|(k, v)| (k.to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    sorted.sort();
    let canonical_headers: String = sorted.iter().map(|(k, v)| format!("{k}:{v}\n")).collect();
    let signed_headers = sorted
        .iter()
        .map(|(k, _)| k.as_str())
        .collect::<Vec<_>>()
        .join(";");
    let canonical_request = format!(
        "{method}\n{path}\n{query}\n{canonical_headers}\n{signed_headers}\n{}",
        hex_sha256(body)
    );
    let credential_scope = format!(
        "{}/{}/{}/aws4_request",
        scope.date, scope.region, scope.service
    );
    let string_to_sign = format!(
        "AWS4-HMAC-SHA256\n{}\n{credential_scope}\n{}",
        scope.amz_date,
        hex_sha256(canonical_request.as_bytes())
    );
    let k_secret = Zeroizing::new(format!("AWS4{secret}"));
    let k_date = Zeroizing::new(hmac(k_secret.as_bytes(), scope.date));
    let k_region = Zeroizing::new(hmac(&k_date, scope.region));
    let k_service = Zeroizing::new(hmac(&k_region, scope.service));
    let k_signing = Zeroizing::new(hmac(&k_service, "aws4_request"));
    let signature = hex(&hmac(&k_signing, &string_to_sign));
    format!(
        "AWS4-HMAC-SHA256 Credential={access_key_id}/{credential_scope}, SignedHeaders={signed_headers}, Signature={signature}"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// AWS's documented example ("Create a signed request", IAM ListUsers, 2015-08-30).
    #[test]
    fn signature_matches_the_aws_documented_example() {
        let headers = vec![
            (
                "content-type".to_owned(),
                "application/x-www-form-urlencoded; charset=utf-8".to_owned(),
            ),
            ("host".to_owned(), "iam.amazonaws.com".to_owned()),
            ("x-amz-date".to_owned(), "20150830T123600Z".to_owned()),
        ];
        let auth = sigv4(
            "GET",
            "/",
            "Action=ListUsers&Version=2010-05-08",
            &headers,
            b"",
            &SigningScope {
                date: "20150830",
                amz_date: "20150830T123600Z",
                region: "us-east-1",
                service: "iam",
            },
            "AKIDEXAMPLE",
            "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY",
        );
        assert!(
            auth.ends_with(
                "Signature=5d672d79c15b13162d9279b0855cfba6789a8edb4c82c400e06b5924a6f2b5d7"
            ),
            "{auth}"
        );
        assert!(auth.contains("SignedHeaders=content-type;host;x-amz-date,"));
    }
}
