//! `Get` on the wire without tonic's two copies of every block.
//!
//! tonic encodes each response message into its own buffer (one copy of the block on
//! the server) and the client's decoder gathers the DATA frames into another (one copy
//! on the client): with the two kernel copies of any socket, a 1 MiB Get moved its
//! bytes four times where raw TCP moves them twice, and a single-connection 1 MiB Get
//! reached about half of loopback TCP. Both ends here speak plain gRPC (any gRPC client
//! or server interoperates), but:
//! - the server ([`GrpcService`]) answers `Get` itself: each message goes out as a small
//!   head (gRPC prefix, the scalar fields, the `data` field's tag and length) followed by
//!   the cached block's `Bytes` as its own body frame, which hyper and h2 hand to the
//!   socket without copying (vectored write);
//! - the client ([`read_get_stream`]) parses the response body itself: a message lying
//!   in one received DATA frame is sliced out of it, not copied (the client advertises
//!   frames up to 16 MiB so a block chunk arrives as one frame).
//!
//! Every other method goes through tonic unchanged, and so does the interceptor
//! ([`TokenCheck`]) and the handler logic of `Get` itself: only the encoding differs.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Buf, BufMut, Bytes, BytesMut};
use futures::StreamExt;
use http_body::Frame;
use http_body_util::BodyExt;
use prost::Message;
use tonic::body::Body;
use tonic::metadata::MetadataMap;
use tonic::server::NamedService;
use tonic::service::interceptor::InterceptedService;
use tonic::service::Interceptor;
use tonic::{Code, Status};
use tower::{Service, ServiceExt};

use crate::pb;
use crate::pb::kv_cache_server::{KvCache, KvCacheServer};
use crate::server::{GetHold, KvService, TokenCheck};

/// HTTP/2 path of the `Get` method.
pub const GET_PATH: &str = "/strata.kv.v1.KvCache/Get";

/// Length of the gRPC message prefix: compression flag (1) + big-endian length (4).
const PREFIX: usize = 5;

/// Tag of `GetResponse.data` (field 2, length-delimited).
const DATA_TAG: u8 = (2 << 3) | 2;

/// The gRPC service with `Get` encoded without copying the block (module docs).
#[derive(Clone)]
pub struct GrpcService {
    service: KvService,
    check: TokenCheck,
    grpc: InterceptedService<KvCacheServer<KvService>, TokenCheck>,
}

impl GrpcService {
    pub(crate) fn new(
        service: KvService,
        check: TokenCheck,
        grpc: InterceptedService<KvCacheServer<KvService>, TokenCheck>,
    ) -> Self {
        GrpcService {
            service,
            check,
            grpc,
        }
    }
}

impl NamedService for GrpcService {
    const NAME: &'static str = <KvCacheServer<KvService> as NamedService>::NAME;
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

impl Service<http::Request<Body>> for GrpcService {
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture<Result<Self::Response, Infallible>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        // Both paths are always ready (tonic's generated server is); `call` readies the
        // inner service itself.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<Body>) -> Self::Future {
        if req.uri().path() == GET_PATH {
            let (service, check) = (self.service.clone(), self.check.clone());
            return Box::pin(async move { Ok(serve_get(service, check, req).await) });
        }
        let mut grpc = self.grpc.clone();
        Box::pin(async move {
            let grpc = ServiceExt::<http::Request<Body>>::ready(&mut grpc).await?;
            Ok(grpc.call(req).await?.map(Body::new))
        })
    }
}

/// One `Get`: the request decoded, the interceptor and the handler run as tonic would,
/// the answer streamed by [`GetBody`].
async fn serve_get(
    service: KvService,
    mut check: TokenCheck,
    req: http::Request<Body>,
) -> http::Response<Body> {
    let (parts, body) = req.into_parts();
    let max = service.max_message_bytes();
    let msg = match read_unary::<pb::GetRequest>(body, max).await {
        Ok(m) => m,
        Err(s) => return s.into_http(),
    };
    let treq = tonic::Request::from_parts(
        MetadataMap::from_headers(parts.headers),
        parts.extensions,
        (),
    );
    let (metadata, extensions, ()) = match check.call(treq) {
        Ok(r) => r.into_parts(),
        Err(s) => return s.into_http(),
    };
    let (stream, hold) = match KvCache::get(
        &service,
        tonic::Request::from_parts(metadata, extensions, msg),
    )
    .await
    {
        Ok(r) => {
            let hold = r.extensions().get::<GetHold>().cloned();
            (r.into_inner(), hold)
        }
        Err(s) => return s.into_http(),
    };
    let mut resp = http::Response::new(Body::new(GetBody {
        stream: Some(stream),
        pending: None,
        _hold: hold,
    }));
    resp.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/grpc"),
    );
    resp
}

/// Reads a unary request body of at most `max` bytes and decodes its one message.
async fn read_unary<M: Message + Default>(body: Body, max: usize) -> Result<M, Status> {
    let bytes = http_body_util::Limited::new(body, max + PREFIX)
        .collect()
        .await
        .map_err(|e| Status::resource_exhausted(format!("request body: {e}")))?
        .to_bytes();
    let (compressed, len) = prefix(&bytes)
        .ok_or_else(|| Status::invalid_argument("request shorter than its gRPC message prefix"))?;
    if compressed {
        return Err(Status::unimplemented("compressed requests"));
    }
    if bytes.len() != PREFIX + len {
        return Err(Status::invalid_argument(
            "a unary request must carry exactly one message",
        ));
    }
    M::decode(&bytes[PREFIX..]).map_err(|e| Status::invalid_argument(format!("request: {e}")))
}

/// Parses a gRPC message prefix: (compressed, length).
fn prefix(b: &[u8]) -> Option<(bool, usize)> {
    let p: [u8; PREFIX] = b.get(..PREFIX)?.try_into().ok()?;
    Some((
        p[0] != 0,
        u32::from_be_bytes([p[1], p[2], p[3], p[4]]) as usize,
    ))
}

/// The head of one encoded `GetResponse`: prefix, scalar fields, then the `data` tag
/// and length; the caller sends `data` itself right after.
pub(crate) fn encode_get_head(msg: &pb::GetResponse) -> Bytes {
    let scalars = pb::GetResponse {
        data: Bytes::new(),
        ..msg.clone()
    };
    let data_len = msg.data.len();
    let data_field = if data_len == 0 {
        0
    } else {
        1 + prost::encoding::encoded_len_varint(data_len as u64) + data_len
    };
    let total = scalars.encoded_len() + data_field;
    let mut head = BytesMut::with_capacity(PREFIX + scalars.encoded_len() + 11);
    head.put_u8(0);
    head.put_u32(total as u32);
    // Cannot fail: the buffer was sized for it.
    let _ = scalars.encode(&mut head);
    if data_len > 0 {
        head.put_u8(DATA_TAG);
        prost::encoding::encode_varint(data_len as u64, &mut head);
    }
    head.freeze()
}

/// A `Get` response body: each message's head, then its block chunk as its own frame,
/// then the trailers (the status).
struct GetBody {
    stream: Option<crate::server::BoxStream<pb::GetResponse>>,
    pending: Option<Bytes>,
    /// The get budget the response holds, until the body is done or dropped.
    _hold: Option<GetHold>,
}

impl http_body::Body for GetBody {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        if let Some(data) = self.pending.take() {
            return Poll::Ready(Some(Ok(Frame::data(data))));
        }
        let Some(stream) = self.stream.as_mut() else {
            return Poll::Ready(None);
        };
        let status = match futures::ready!(stream.poll_next_unpin(cx)) {
            Some(Ok(msg)) => {
                let head = encode_get_head(&msg);
                if !msg.data.is_empty() {
                    self.pending = Some(msg.data);
                }
                return Poll::Ready(Some(Ok(Frame::data(head))));
            }
            Some(Err(s)) => s,
            None => Status::ok(""),
        };
        self.stream = None;
        let mut trailers = http::HeaderMap::new();
        if let Err(e) = status.add_header(&mut trailers) {
            return Poll::Ready(Some(Err(e)));
        }
        Poll::Ready(Some(Ok(Frame::trailers(trailers))))
    }

    fn is_end_stream(&self) -> bool {
        self.stream.is_none() && self.pending.is_none()
    }
}

/// Received body bytes as the frames they came in; takes messages out of them,
/// slicing (not copying) what lies in one frame.
#[derive(Default)]
pub(crate) struct Rope {
    parts: VecDeque<Bytes>,
    len: usize,
}

impl Rope {
    pub(crate) fn push(&mut self, b: Bytes) {
        if !b.is_empty() {
            self.len += b.len();
            self.parts.push_back(b);
        }
    }

    fn peek_prefix(&self) -> Option<[u8; PREFIX]> {
        if self.len < PREFIX {
            return None;
        }
        let mut out = [0u8; PREFIX];
        let mut n = 0;
        for p in &self.parts {
            let take = (PREFIX - n).min(p.len());
            out[n..n + take].copy_from_slice(&p[..take]);
            n += take;
            if n == PREFIX {
                break;
            }
        }
        Some(out)
    }

    /// The next complete message, if all of it has arrived.
    pub(crate) fn next_message<M: Message + Default>(
        &mut self,
        max: usize,
    ) -> Result<Option<M>, Status> {
        let Some(p) = self.peek_prefix() else {
            return Ok(None);
        };
        let (compressed, len) = prefix(&p).unwrap_or((false, 0));
        if compressed {
            return Err(Status::internal("compressed response, none was asked for"));
        }
        if len > max {
            return Err(Status::resource_exhausted(format!(
                "response message of {len} bytes exceeds the limit of {max}"
            )));
        }
        if self.len < PREFIX + len {
            return Ok(None);
        }
        self.advance(PREFIX);
        M::decode(Buf::take(&mut *self, len))
            .map(Some)
            .map_err(|e| Status::internal(format!("response: {e}")))
    }
}

impl Buf for Rope {
    fn remaining(&self) -> usize {
        self.len
    }

    fn chunk(&self) -> &[u8] {
        self.parts.front().map(|b| &b[..]).unwrap_or_default()
    }

    fn advance(&mut self, mut cnt: usize) {
        assert!(cnt <= self.len, "advance past the end of the rope");
        self.len -= cnt;
        while cnt > 0 {
            let Some(front) = self.parts.front_mut() else {
                return;
            };
            if front.len() > cnt {
                front.advance(cnt);
                return;
            }
            cnt -= front.len();
            self.parts.pop_front();
        }
    }

    fn copy_to_bytes(&mut self, len: usize) -> Bytes {
        assert!(len <= self.len, "copy_to_bytes past the end of the rope");
        if let Some(front) = self.parts.front_mut() {
            if front.len() >= len {
                // The common case: the block chunk is one frame; slice, no copy.
                let out = front.split_to(len);
                self.len -= len;
                if front.is_empty() {
                    self.parts.pop_front();
                }
                return out;
            }
        }
        let mut out = BytesMut::with_capacity(len);
        out.put(Buf::take(&mut *self, len));
        out.freeze()
    }
}

/// Turns a gRPC response's headers into its error, if it is a trailers-only error.
fn header_status(resp: &http::response::Parts) -> Option<Status> {
    if resp.status != http::StatusCode::OK {
        return Some(Status::unknown(format!(
            "HTTP status {} from the server",
            resp.status
        )));
    }
    Status::from_header_map(&resp.headers).filter(|s| s.code() != Code::Ok)
}

/// Sends one `Get` over `channel` and returns its response messages as they come,
/// through `on_message` (which may stop the stream early by returning false).
pub(crate) async fn call_get<C>(
    channel: &mut C,
    origin: &http::Uri,
    metadata: MetadataMap,
    req: &pb::GetRequest,
    max: usize,
    mut on_message: impl FnMut(pb::GetResponse) -> Result<bool, Status>,
) -> Result<(), crate::KvError>
where
    C: Service<http::Request<Body>, Response = http::Response<Body>>,
    C::Error: Into<crate::KvError>,
{
    let mut body = BytesMut::with_capacity(PREFIX + req.encoded_len());
    body.put_u8(0);
    body.put_u32(req.encoded_len() as u32);
    let _ = req.encode(&mut body);
    let mut uri = http::uri::Parts::default();
    uri.scheme = origin.scheme().cloned();
    uri.authority = origin.authority().cloned();
    uri.path_and_query = Some(http::uri::PathAndQuery::from_static(GET_PATH));
    let uri = http::Uri::from_parts(uri)
        .map_err(|e| crate::KvError::Config(format!("request URI: {e}")))?;
    let mut http_req = http::Request::new(Body::new(http_body_util::Full::new(body.freeze())));
    *http_req.method_mut() = http::Method::POST;
    *http_req.uri_mut() = uri;
    *http_req.headers_mut() = metadata.into_headers();
    let h = http_req.headers_mut();
    h.insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/grpc"),
    );
    h.insert(http::header::TE, http::HeaderValue::from_static("trailers"));
    let svc = channel.ready().await.map_err(Into::into)?;
    let resp = svc.call(http_req).await.map_err(Into::into)?;
    let (parts, mut body) = resp.into_parts();
    if let Some(s) = header_status(&parts) {
        return Err(s.into());
    }
    let mut rope = Rope::default();
    while let Some(frame) = body.frame().await {
        let frame = frame?;
        let frame = match frame.into_data() {
            Ok(data) => {
                rope.push(data);
                while let Some(m) = rope.next_message::<pb::GetResponse>(max)? {
                    if !on_message(m)? {
                        return Ok(());
                    }
                }
                continue;
            }
            Err(f) => f,
        };
        if let Some(t) = frame.trailers_ref() {
            if let Some(s) = Status::from_header_map(t).filter(|s| s.code() != Code::Ok) {
                return Err(s.into());
            }
            if rope.remaining() > 0 {
                return Err(Status::internal("response ended inside a message").into());
            }
            return Ok(());
        }
    }
    Err(Status::internal("response ended without its status").into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn head_then_data_decodes_as_the_message_prost_would_encode() {
        let msg = pb::GetResponse {
            size: 3 << 20,
            data: Bytes::from(vec![9u8; 300]),
            shm_offset: 0,
            shm_lease: 0,
            ..Default::default()
        };
        let mut wire = BytesMut::new();
        wire.extend_from_slice(&encode_get_head(&msg));
        wire.extend_from_slice(&msg.data);
        let want = msg.encode_to_vec();
        assert_eq!(wire.len(), PREFIX + want.len());
        // Uncompressed, and the length prost's own encoding has (308 bytes here).
        assert_eq!(&wire[..PREFIX], &[0, 0, 0, 1, 52]);
        assert_eq!(want.len(), 308);
        assert_eq!(pb::GetResponse::decode(&wire[PREFIX..]).unwrap(), msg);
        // A lease answer has no data field.
        let lease = pb::GetResponse {
            size: 10,
            data: Bytes::new(),
            shm_offset: 4096,
            shm_lease: 7,
            device_handle: Bytes::from_static(b"SGIP handle bytes"),
        };
        let head = encode_get_head(&lease);
        assert_eq!(pb::GetResponse::decode(&head[PREFIX..]).unwrap(), lease);
    }

    #[test]
    fn a_chunk_in_one_frame_is_sliced_and_one_split_across_frames_is_gathered() {
        let msg = pb::GetResponse {
            size: 1000,
            data: Bytes::from((0..1000u32).map(|i| i as u8).collect::<Vec<_>>()),
            ..Default::default()
        };
        // As the server sends it: head frame, then the data frame.
        let mut rope = Rope::default();
        let data = msg.data.clone();
        rope.push(encode_get_head(&msg));
        assert!(rope
            .next_message::<pb::GetResponse>(1 << 20)
            .unwrap()
            .is_none());
        rope.push(data.clone());
        let got = rope
            .next_message::<pb::GetResponse>(1 << 20)
            .unwrap()
            .unwrap();
        assert_eq!(got, msg);
        assert_eq!(got.data.as_ptr(), data.as_ptr(), "sliced, not copied");
        assert_eq!(rope.remaining(), 0);

        // Split at every offset into three frames: the same message each time.
        let mut wire = BytesMut::new();
        wire.extend_from_slice(&encode_get_head(&msg));
        wire.extend_from_slice(&msg.data);
        let wire = wire.freeze();
        for cut in [1, 3, 5, 6, 9, 500, wire.len() - 1] {
            let mut rope = Rope::default();
            rope.push(wire.slice(..cut));
            rope.push(wire.slice(cut..cut + 1.min(wire.len() - cut)));
            rope.push(wire.slice((cut + 1).min(wire.len())..));
            let got = rope
                .next_message::<pb::GetResponse>(1 << 20)
                .unwrap()
                .unwrap();
            assert_eq!(got, msg, "cut at {cut}");
        }
    }

    #[test]
    fn oversized_and_compressed_messages_are_refused() {
        let mut rope = Rope::default();
        rope.push(Bytes::from_static(&[0, 0, 0x10, 0, 1]));
        assert_eq!(
            rope.next_message::<pb::GetResponse>(1 << 20)
                .unwrap_err()
                .code(),
            Code::ResourceExhausted
        );
        let mut rope = Rope::default();
        rope.push(Bytes::from_static(&[1, 0, 0, 0, 0]));
        assert_eq!(
            rope.next_message::<pb::GetResponse>(1 << 20)
                .unwrap_err()
                .code(),
            Code::Internal
        );
    }
}
