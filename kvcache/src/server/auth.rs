//! Interceptors: the client listener's bearer token and model identity, the peer
//! listener's group token and forwarded tenant.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use tonic::{Request, Status};

use super::{AuthTenant, CallerIdentity, KvService};
use crate::group::{GROUP_TOKEN_METADATA, PEER_TENANT_METADATA};
use crate::keys::{parse_identity_hex, IDENTITY_METADATA};
use crate::limits::ConnInfo;
use crate::tenants::{constant_time_eq, Tenants};

/// Checks the bearer token of every request: a tenant's token when tenants are
/// configured (the request then carries its tenant), else the one token if set.
#[derive(Clone)]
pub struct TokenCheck {
    pub(super) token: Option<Arc<str>>,
    pub(super) tenants: Arc<Tenants>,
    pub(super) stats: KvService,
}

impl tonic::service::Interceptor for TokenCheck {
    fn call(&mut self, mut req: Request<()>) -> std::result::Result<Request<()>, Status> {
        if let Some(v) = req.metadata().get(IDENTITY_METADATA) {
            let digest = v
                .to_str()
                .ok()
                .and_then(parse_identity_hex)
                .ok_or_else(|| {
                    self.stats.inner.stats.rejected();
                    Status::invalid_argument(format!(
                        "{IDENTITY_METADATA} must be a 32-byte digest in hex (64 digits)"
                    ))
                })?;
            req.extensions_mut().insert(CallerIdentity(digest));
        }
        if self.tenants.is_empty() && self.token.is_none() {
            vouch(&req);
            return Ok(req);
        }
        let got = req
            .metadata()
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .map(str::as_bytes);
        if !self.tenants.is_empty() {
            if let Some(t) = got.and_then(|g| self.tenants.authenticate(g)) {
                req.extensions_mut().insert(AuthTenant(t));
                vouch(&req);
                return Ok(req);
            }
        } else if let (Some(want), Some(g)) = (&self.token, got) {
            if constant_time_eq(g, want.as_bytes()) {
                vouch(&req);
                return Ok(req);
            }
        }
        self.stats.inner.stats.rejected();
        Err(Status::unauthenticated("missing or wrong bearer token"))
    }
}

/// Checks the calls on the peer listener: the group token, then the tenant and model
/// identity the entry node forwards (`group.rs`).
#[derive(Clone)]
pub struct PeerCheck {
    pub(super) svc: KvService,
}

impl tonic::service::Interceptor for PeerCheck {
    fn call(&mut self, mut req: Request<()>) -> std::result::Result<Request<()>, Status> {
        let inner = &self.svc.inner;
        let Some(router) = inner.router.get() else {
            return Err(Status::unavailable(
                "this node's KV service is not in a group",
            ));
        };
        if let Some(want) = router.opts.token.as_deref() {
            let got = req
                .metadata()
                .get(GROUP_TOKEN_METADATA)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.strip_prefix("Bearer "))
                .map(str::as_bytes)
                .unwrap_or_default();
            if !constant_time_eq(got, want.as_bytes()) {
                inner.stats.rejected();
                return Err(Status::unauthenticated("missing or wrong group token"));
            }
        }
        if let Some(v) = req.metadata().get(IDENTITY_METADATA) {
            let digest = v
                .to_str()
                .ok()
                .and_then(parse_identity_hex)
                .ok_or_else(|| Status::invalid_argument("bad forwarded model identity"))?;
            req.extensions_mut().insert(CallerIdentity(digest));
        }
        if !inner.tenants.is_empty() {
            // With tenants, a forwarded call acts for one, named by the entry node that
            // authenticated it; its patterns, key space and quota apply here again.
            let tenant = req
                .metadata()
                .get(PEER_TENANT_METADATA)
                .and_then(|v| v.to_str().ok())
                .and_then(|name| inner.tenants.by_name(name))
                .ok_or_else(|| {
                    inner.stats.rejected();
                    Status::permission_denied("a forwarded call must name a known tenant")
                })?;
            req.extensions_mut().insert(AuthTenant(tenant));
        }
        inner.served_for_peers.fetch_add(1, Ordering::Relaxed);
        Ok(req)
    }
}

/// The request's connection passed authentication: it keeps its listener slot
/// (`accept.rs`; a connection that never does may be closed to make room).
fn vouch(req: &Request<()>) {
    if let Some(c) = ConnInfo::of(req) {
        c.vouch();
    }
}
