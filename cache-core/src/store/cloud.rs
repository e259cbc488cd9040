//! The cloud clients (S3, GCS, Azure) built from a URL's scheme and the store's
//! options: the endpoint checked before any request, their own retries off (ours is
//! the only policy), paged listing where the client has one.

use std::sync::Arc;
use std::time::Duration;

use object_store::ObjectStore;

use super::StoreOptions;

/// The longest object key S3, GCS and Azure Blob take, in bytes (UTF-8): 1,024.
pub const CLOUD_KEY_MAX: usize = 1024;

/// A cloud store as the traits the handle uses: objects, multipart by part index, and
/// paged listing where it has one.
pub(super) type CloudStore = (
    Arc<dyn ObjectStore>,
    Arc<dyn object_store::multipart::MultipartStore>,
    Option<Arc<dyn object_store::list::PaginatedListStore>>,
);

/// Whether the cloud clients can use `endpoint`, checked before any request (black-box
/// findings: one without a scheme panicked inside the S3 request signer; a plain-HTTP
/// one without `allow_http`, or a mistyped scheme, failed every request as a "builder
/// error", and the mount took that for a store that does not answer and mounted).
pub(super) fn check_endpoint(endpoint: &str, allow_http: bool) -> std::result::Result<(), String> {
    let usage = "expected http://HOST[:PORT] or https://HOST[:PORT]";
    let Some((scheme, rest)) = endpoint.split_once("://") else {
        return Err(format!("endpoint {endpoint:?}: {usage}"));
    };
    let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
    let port = match authority.rsplit_once(']') {
        Some((_, after)) => after.strip_prefix(':'),
        None => authority.rsplit_once(':').map(|(_, p)| p),
    };
    if authority.is_empty()
        || authority.starts_with(':')
        || authority.contains(|c: char| c.is_whitespace() || c == '@')
        || port.is_some_and(|p| p.parse::<u16>().is_err())
    {
        return Err(format!("endpoint {endpoint:?}: {usage}"));
    }
    match scheme {
        "https" => Ok(()),
        "http" if allow_http => Ok(()),
        "http" => Err(format!(
            "endpoint {endpoint:?} is plain HTTP: allow it with --allow-http \
             (allow_http = true under [store])"
        )),
        other => Err(format!(
            "endpoint {endpoint:?}: unsupported scheme {other:?} ({usage})"
        )),
    }
}

/// The cloud client for `bucket`, and the endpoint it was built with when not the
/// provider's own (from the options, the backend's config keys or its environment
/// variables, e.g. `AWS_ENDPOINT_URL`).
pub(super) fn cloud_store(
    scheme: &str,
    bucket: &str,
    opts: &StoreOptions,
) -> object_store::Result<(CloudStore, Option<String>, bool)> {
    // The same client seen as both traits: its multipart API sends parts by index.
    fn both<S: ObjectStore + object_store::multipart::MultipartStore>(s: S) -> CloudStore {
        let s = Arc::new(s);
        (s.clone(), s, None)
    }
    // And as a paged lister (S3, GCS): listings step around keys it cannot name.
    fn paged<
        S: ObjectStore
            + object_store::multipart::MultipartStore
            + object_store::list::PaginatedListStore,
    >(
        s: S,
    ) -> CloudStore {
        let s = Arc::new(s);
        (s.clone(), s.clone(), Some(s))
    }
    // Our retry loop is the only one: the cloud clients' own (10 retries over up to 3
    // minutes by default) would turn a dead store into a hang.
    let retry = object_store::RetryConfig {
        max_retries: 0,
        ..Default::default()
    };
    let client = object_store::ClientOptions::new()
        .with_timeout(opts.retry.attempt_timeout)
        .with_connect_timeout(Duration::from_secs(5))
        .with_allow_http(opts.allow_http);
    Ok(match scheme {
        "s3" => {
            let mut b = object_store::aws::AmazonS3Builder::from_env();
            // Create-only copies (a rename on a mount that may not replace objects):
            // a multipart copy completed with If-None-Match, which AWS S3 and moto
            // honour, unless the environment or the store's options name another way.
            let copy_key = object_store::aws::AmazonS3ConfigKey::CopyIfNotExists;
            if b.get_config_value(&copy_key).is_none() {
                b = b.with_copy_if_not_exists(object_store::aws::S3CopyIfNotExists::Multipart);
            }
            b = b
                .with_http_connector(SanitizedHeaders)
                .with_bucket_name(bucket)
                .with_retry(retry)
                .with_client_options(client)
                .with_allow_http(opts.allow_http);
            if let Some(e) = &opts.endpoint {
                b = b.with_endpoint(e).with_virtual_hosted_style_request(false);
            }
            if let Some(r) = &opts.region {
                b = b.with_region(r);
            }
            if let Some(k) = &opts.access_key_id {
                b = b.with_access_key_id(k);
            }
            if let Some(s) = &opts.secret_access_key {
                b = b.with_secret_access_key(s);
            }
            for (k, v) in &opts.extra {
                b = b.with_config(k.parse()?, v);
            }
            let endpoint = b.get_config_value(&object_store::aws::AmazonS3ConfigKey::Endpoint);
            let multipart_copies = b.get_config_value(&copy_key).as_deref() == Some("multipart");
            (paged(b.build()?), endpoint, multipart_copies)
        }
        "gs" => {
            let mut b = object_store::gcp::GoogleCloudStorageBuilder::from_env()
                .with_http_connector(SanitizedHeaders)
                .with_bucket_name(bucket)
                .with_retry(retry)
                .with_client_options(client);
            for (k, v) in &opts.extra {
                b = b.with_config(k.parse()?, v);
            }
            (paged(b.build()?), None, false)
        }
        _ => {
            let mut b = object_store::azure::MicrosoftAzureBuilder::from_env()
                .with_http_connector(SanitizedHeaders)
                .with_container_name(bucket)
                .with_retry(retry)
                .with_client_options(client)
                .with_allow_http(opts.allow_http);
            if let Some(e) = &opts.endpoint {
                b = b.with_endpoint(e.clone());
            }
            for (k, v) in &opts.extra {
                b = b.with_config(k.parse()?, v);
            }
            let endpoint = b.get_config_value(&object_store::azure::AzureConfigKey::Endpoint);
            (both(b.build()?), endpoint, false)
        }
    })
}

/// The cloud clients' HTTP connector: object_store's own (reqwest), with header values
/// it would refuse made readable first.
///
/// object_store parses `Cache-Control`, `Content-Disposition`, `Content-Encoding`,
/// `Content-Language`, `Content-Type` and user metadata of every GET and HEAD as
/// visible ASCII, and fails the request on any other byte. Stores that keep headers as
/// given echo raw UTF-8 (`filename="résumé.pdf"`), and such objects could not be read
/// at all (black-box finding: EIO after 8 attempts). We use none of those values to
/// serve bytes, so a value that is not visible ASCII is percent-encoded (RFC 3986
/// style, byte by byte) before object_store sees it; what it means is kept, the read
/// goes on.
#[derive(Debug, Clone, Copy)]
struct SanitizedHeaders;

impl object_store::client::HttpConnector for SanitizedHeaders {
    fn connect(
        &self,
        options: &object_store::ClientOptions,
    ) -> object_store::Result<object_store::client::HttpClient> {
        let inner = object_store::client::ReqwestConnector::default().connect(options)?;
        Ok(object_store::client::HttpClient::new(SanitizingService(
            inner,
        )))
    }
}

#[derive(Debug)]
struct SanitizingService(object_store::client::HttpClient);

#[async_trait::async_trait]
impl object_store::client::HttpService for SanitizingService {
    async fn call(
        &self,
        req: object_store::client::HttpRequest,
    ) -> Result<object_store::client::HttpResponse, object_store::client::HttpError> {
        let mut resp = self.0.execute(req).await?;
        sanitize_headers(resp.headers_mut());
        Ok(resp)
    }
}

/// Percent-encodes, in place, the values of the headers object_store reads as text
/// that hold bytes other than visible ASCII (see [`SanitizedHeaders`]).
fn sanitize_headers(headers: &mut http::HeaderMap) {
    use http::header::{
        CACHE_CONTROL, CONTENT_DISPOSITION, CONTENT_ENCODING, CONTENT_LANGUAGE, CONTENT_TYPE,
    };
    const READ_AS_TEXT: [http::HeaderName; 5] = [
        CACHE_CONTROL,
        CONTENT_DISPOSITION,
        CONTENT_ENCODING,
        CONTENT_LANGUAGE,
        CONTENT_TYPE,
    ];
    for (name, value) in headers.iter_mut() {
        let read_as_text = READ_AS_TEXT.contains(name) || name.as_str().contains("-meta-");
        if read_as_text && value.to_str().is_err() {
            let mut text = String::with_capacity(value.len() * 3);
            for &b in value.as_bytes() {
                if b.is_ascii_graphic() || b == b' ' {
                    text.push(b as char);
                } else {
                    text.push_str(&format!("%{b:02X}"));
                }
            }
            if let Ok(v) = http::HeaderValue::from_str(&text) {
                *value = v;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_values_object_store_refuses_are_percent_encoded_and_others_kept() {
        let mut h = http::HeaderMap::new();
        let raw = |b: &[u8]| http::HeaderValue::from_bytes(b).expect("a header value");
        h.insert(
            http::header::CONTENT_DISPOSITION,
            raw("attachment; filename=\"résumé.pdf\"".as_bytes()),
        );
        h.insert("x-amz-meta-name", raw("café".as_bytes()));
        h.insert(http::header::CONTENT_TYPE, raw(b"application/json"));
        h.insert(http::header::ETAG, raw("\"é\"".as_bytes()));
        sanitize_headers(&mut h);
        assert_eq!(
            h[http::header::CONTENT_DISPOSITION],
            "attachment; filename=\"r%C3%A9sum%C3%A9.pdf\""
        );
        assert_eq!(h["x-amz-meta-name"], "caf%C3%A9");
        assert_eq!(h[http::header::CONTENT_TYPE], "application/json");
        // Not one object_store reads as text: left as it came.
        assert_eq!(h[http::header::ETAG].as_bytes(), "\"é\"".as_bytes());
    }
}
