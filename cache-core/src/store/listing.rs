//! Listings that step around keys the client library cannot name.
//!
//! object_store names every listed key as a [`Path`], and a key it cannot parse (a
//! control character, an empty or `.` segment: `a//b`, `a/./b`, all legal in S3 and
//! GCS) fails the whole page it is on, and the listing stops there: one odd key written
//! by another tool would hide up to 1,000 of its neighbours and everything after them.
//! Such a key cannot be read through object_store either, so it is skipped; its
//! neighbours must not be.
//!
//! Where the store offers paged listing ([`PaginatedListStore`]: S3, GCS), the listing
//! is redone in pages that start after the last name seen (`start-after`). A page that
//! fails is asked again at half the size until the page of one entry that fails is the
//! odd key itself: the parse error carries its text, and the next page starts after it
//! (after everything under it, for a common prefix). Pages then grow back to full
//! size. A listing with one odd key costs about `2 log2(1000)` = 20 extra requests.

use std::sync::Arc;

use object_store::list::{PaginatedListOptions, PaginatedListResult, PaginatedListStore};
use object_store::path::Path;
use object_store::{ListResult, ObjectMeta};

/// A full page, as S3 and GCS send by default.
const PAGE_KEYS: usize = 1000;
/// Empty pages in a row that a listing follows by their tokens before it gives up on a
/// store that makes no progress: 1000 (a million deleted keys scanned past).
const MAX_EMPTY_PAGES: usize = 1000;

/// Sorts after every name under a prefix: `start-after` of `dir/` + this skips the
/// whole of `dir/` (keys are UTF-8, compared by bytes; U+10FFFF is the greatest).
const AFTER_ALL: char = '\u{10FFFF}';

/// Paged listing of a store, under the handle's own prefix (`s3://bucket/prefix`).
pub(super) struct PagedLister {
    pub(super) store: Arc<dyn PaginatedListStore>,
    /// The handle's prefix ("" for a whole bucket), without slashes at either end...
    base: String,
    /// ...as a path, to strip from listed keys (None: a whole bucket).
    base_path: Option<Path>,
}

impl PagedLister {
    pub(super) fn new(store: Arc<dyn PaginatedListStore>, base: &str) -> Self {
        let base = base.trim_matches('/').to_string();
        let base_path = (!base.is_empty()).then(|| super::object_key(&base));
        PagedLister {
            store,
            base,
            base_path,
        }
    }

    /// The objects under `prefix` (relative to the handle), one level (`delimiter`) or
    /// all of them, skipping keys object_store cannot name (each logged). Paths in the
    /// result are relative to the handle, as the handle's other listings are.
    pub(super) async fn list(
        &self,
        prefix: Option<&Path>,
        delimiter: bool,
        label: &str,
    ) -> object_store::Result<ListResult> {
        let store = &self.store;
        let listed = self
            .list_via(prefix, delimiter, label, |p, o| async move {
                Ok::<_, std::convert::Infallible>(store.list_paginated(p.as_deref(), o).await)
            })
            .await;
        match listed {
            Ok(r) => r,
            Err(never) => match never {},
        }
    }

    /// [`Self::list`] with each page asked by `page(prefix, options)`: its outer error
    /// ends the listing as it is (a caller's retry policy gave up on that page), its
    /// inner one is the store's answer to the page. So a caller retries page by page,
    /// and a listing of many pages that each come in time is slow, never failed
    /// (black-box finding: a folder whose pages took 8 s each was EIO after 40 s, and
    /// every retry began again at its first page).
    pub(super) async fn list_via<E, F, Fut>(
        &self,
        prefix: Option<&Path>,
        delimiter: bool,
        label: &str,
        mut page: F,
    ) -> Result<object_store::Result<ListResult>, E>
    where
        F: FnMut(Option<String>, PaginatedListOptions) -> Fut,
        Fut: std::future::Future<Output = Result<object_store::Result<PaginatedListResult>, E>>,
    {
        let full = self.full_prefix(prefix);
        let mut out = ListResult {
            common_prefixes: Vec::new(),
            objects: Vec::new(),
            extensions: Default::default(),
        };
        let mut start_after: Option<String> = None;
        let mut want = PAGE_KEYS;
        let mut last_skipped: Option<String> = None;
        let mut cr_tried = false;
        // The token of an empty page the store says is not the last, and how many such
        // pages came in a row (see below).
        let mut token: Option<String> = None;
        let mut empty_pages = 0;
        loop {
            let sent_token = token.take();
            let opts = PaginatedListOptions {
                offset: start_after.clone(),
                delimiter: delimiter.then_some("/".into()),
                max_keys: Some(want),
                page_token: sent_token.clone(),
                ..Default::default()
            };
            let req_prefix = (!full.is_empty()).then(|| full.clone());
            match page(req_prefix, opts).await? {
                Ok(page) => {
                    let mut last: Option<String> = None;
                    for m in page.result.objects {
                        // The key as listed, as far as its parsed name tells: a folder
                        // marker `a/` is named `a`, and starting after `a` lists it
                        // again (black-box finding: a folder holding a marker and a key
                        // that cannot be named was listed page after page, for ever).
                        if let Some(key) = least_key_after(m.location.as_ref(), &start_after) {
                            note_last(&mut last, key);
                        }
                        if let Some(m) = self.relative_meta(m) {
                            out.objects.push(m);
                        }
                    }
                    for p in page.result.common_prefixes {
                        note_last(&mut last, format!("{}/{AFTER_ALL}", p.as_ref()));
                        if let Some(p) = self.relative(&p) {
                            out.common_prefixes.push(p);
                        }
                    }
                    match (page.page_token, last) {
                        (Some(_), Some(last)) => {
                            start_after = Some(last);
                            empty_pages = 0;
                        }
                        // An empty page that is not the last (S3 may answer fewer keys
                        // than asked, none included, while it scans past deleted ones):
                        // its token goes on from where the scan stopped (black-box
                        // finding: such a page failed the folder's readdir for good).
                        (Some(next), None)
                            if empty_pages < MAX_EMPTY_PAGES
                                && Some(&next) != sent_token.as_ref() =>
                        {
                            empty_pages += 1;
                            token = Some(next);
                        }
                        (Some(_), None) => {
                            // Nothing in the page sorts after where it started: a
                            // store that ignores `start-after` would be listed for ever.
                            return Ok(Err(object_store::Error::Generic {
                                store: "paged listing",
                                source: format!(
                                    "the listing of {full:?} made no progress past {start_after:?}"
                                )
                                .into(),
                            }));
                        }
                        (None, _) => break,
                    }
                    want = (want * 2).min(PAGE_KEYS);
                }
                Err(object_store::Error::InvalidPath { source }) if want > 1 => {
                    tracing::debug!(store = label, want, error = %source, "narrowing a listing page");
                    want /= 2;
                }
                Err(object_store::Error::InvalidPath { source }) => {
                    let Some(bad) = unnamed_key(&source) else {
                        return Ok(Err(object_store::Error::InvalidPath { source }));
                    };
                    // The same key again: the listing's XML turned a carriage return
                    // of the key into a line feed (`Icon\r`, which macOS puts in every
                    // folder given an icon, read as `Icon\n`), and starting after the
                    // line-feed spelling, which sorts first, met the key again. The
                    // carriage-return spelling is tried once (black-box finding: the
                    // whole folder was EIO). Otherwise (a store whose offset includes
                    // its own key) give up rather than loop.
                    let resume = match &last_skipped {
                        Some(last) if *last == bad && bad.contains('\n') && !cr_tried => {
                            cr_tried = true;
                            bad.replace('\n', "\r")
                        }
                        Some(last) if *last == bad => {
                            return Ok(Err(object_store::Error::InvalidPath { source }));
                        }
                        _ => {
                            cr_tried = false;
                            bad.clone()
                        }
                    };
                    tracing::warn!(store = label, key = ?resume, error = %source,
                        "skipping a key that cannot be named; listing its neighbours");
                    start_after = Some(if delimiter && resume.ends_with('/') {
                        format!("{resume}{AFTER_ALL}")
                    } else {
                        resume
                    });
                    last_skipped = Some(bad);
                    want = 1;
                }
                Err(e) => return Ok(Err(e)),
            }
        }
        // A marker listed again by the page after it (see above) is one entry.
        let mut seen = std::collections::HashSet::new();
        out.objects.retain(|m| seen.insert(m.location.clone()));
        let mut seen = std::collections::HashSet::new();
        out.common_prefixes.retain(|p| seen.insert(p.clone()));
        Ok(Ok(out))
    }

    /// One request: the first entry under `prefix` (None: the handle's root), to see
    /// that the store answers, however many pages the folder has.
    pub(super) async fn first_entry(&self, prefix: Option<&Path>) -> object_store::Result<()> {
        let full = self.full_prefix(prefix);
        let opts = PaginatedListOptions {
            delimiter: Some("/".into()),
            max_keys: Some(1),
            ..Default::default()
        };
        let req_prefix = (!full.is_empty()).then_some(full.as_str());
        self.store
            .list_paginated(req_prefix, opts)
            .await
            .map(|_| ())
    }

    /// One level under `prefix` if one page of the store holds all of it; None if it
    /// has more (or a key object_store cannot name, which [`Self::list`] steps
    /// around): it exists then, and whoever needs its entries lists it whole. For a
    /// lookup, which only asks whether a folder is there: a folder of 20,000 keys cost
    /// 22 LIST requests per lookup, each time its name's attributes expired
    /// (black-box finding: 7-9 s per `open` on moto, every 5 s).
    pub(super) async fn list_if_one_page(
        &self,
        prefix: &Path,
    ) -> object_store::Result<Option<ListResult>> {
        let full = self.full_prefix(Some(prefix));
        let opts = PaginatedListOptions {
            delimiter: Some("/".into()),
            max_keys: Some(PAGE_KEYS),
            ..Default::default()
        };
        let page = match self.store.list_paginated(Some(&full), opts).await {
            Ok(page) => page,
            Err(object_store::Error::InvalidPath { .. }) => return Ok(None),
            Err(e) => return Err(e),
        };
        if page.page_token.is_some() {
            return Ok(None);
        }
        let objects = page
            .result
            .objects
            .into_iter()
            .filter_map(|m| self.relative_meta(m))
            .collect();
        let common_prefixes = page
            .result
            .common_prefixes
            .iter()
            .filter_map(|p| self.relative(p))
            .collect();
        Ok(Some(ListResult {
            common_prefixes,
            objects,
            extensions: Default::default(),
        }))
    }

    /// The store's key prefix of folder `prefix` of the handle (None: its root), with
    /// its trailing `/` ("" for a whole bucket's root).
    fn full_prefix(&self, prefix: Option<&Path>) -> String {
        match (self.base.is_empty(), prefix.map(|p| p.as_ref())) {
            (true, None) => String::new(),
            (true, Some(p)) => format!("{p}/"),
            (false, None) => format!("{}/", self.base),
            (false, Some(p)) => format!("{}/{p}/", self.base),
        }
    }

    /// `p` without the handle's prefix (None: not under it).
    fn relative(&self, p: &Path) -> Option<Path> {
        match &self.base_path {
            None => Some(p.clone()),
            Some(base) => p.prefix_match(base).map(Path::from_iter),
        }
    }

    fn relative_meta(&self, mut m: ObjectMeta) -> Option<ObjectMeta> {
        m.location = self.relative(&m.location)?;
        Some(m)
    }
}

/// Keeps the greatest name seen in a page (its entries are sorted, but objects and
/// common prefixes come as two lists).
fn note_last(last: &mut Option<String>, name: String) {
    if last.as_ref().is_none_or(|l| name > *l) {
        *last = Some(name);
    }
}

/// The least key that an object named `name` may have been listed as and that sorts
/// after `after` (keys in a page all do): `name` itself, or `name/` (a folder marker,
/// whose trailing slash the parsed name drops). None: neither sorts after it.
fn least_key_after(name: &str, after: &Option<String>) -> Option<String> {
    [name.to_string(), format!("{name}/")]
        .into_iter()
        .find(|k| after.as_ref().is_none_or(|a| k > a))
}

/// The listed text a parse error is about.
fn unnamed_key(e: &object_store::path::Error) -> Option<String> {
    use object_store::path::Error as E;
    match e {
        E::EmptySegment { path } | E::BadSegment { path, .. } => Some(path.clone()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use object_store::{ObjectStore, ObjectStoreExt};

    use super::*;
    use crate::store::faulty::{FaultConfig, FaultyStore};
    use crate::{BackingStore, RetryPolicy};

    /// Black-box finding: a folder whose listing pages each came in time, but took
    /// longer together than one request's deadline, could never be listed (EIO, and
    /// every retry began again at its first page). Each page now has the deadline.
    #[tokio::test]
    async fn a_listing_of_many_slow_pages_is_slow_not_failed() {
        let f = Arc::new(FaultyStore::new(
            Arc::new(object_store::memory::InMemory::new()),
            FaultConfig::default(),
        ));
        for i in 0..2500 {
            f.put(&Path::from(format!("big/k{i:05}")), vec![1u8].into())
                .await
                .expect("put");
        }
        f.set_config(FaultConfig {
            latency: Duration::from_millis(150),
            list_page_keys: 1000,
            ..FaultConfig::default()
        });
        let retry = RetryPolicy {
            attempts: 2,
            base_backoff: Duration::from_millis(10),
            max_backoff: Duration::from_millis(10),
            attempt_timeout: Duration::from_millis(300),
            total_timeout: Duration::from_millis(400),
            silent_pause: Duration::ZERO,
        };
        let mut store = BackingStore::new(f.clone() as Arc<dyn ObjectStore>, "paged", retry);
        // The whole listing as one request: three pages pass its deadline.
        let e = store.list_dir("big").await.expect_err("one deadline");
        assert!(matches!(e, crate::CacheError::StoreTimeout { .. }), "{e}");
        store.paged = Some(Arc::new(PagedLister::new(f.clone(), "")));
        let listed = store.list_dir("big").await.expect("page by page");
        assert_eq!(listed.files.len(), 2500);
        assert!(listed.files.windows(2).all(|w| w[0].path < w[1].path));
    }

    /// Black-box finding (round 18): an empty page that is not the last (S3 scanning
    /// past deleted keys) failed the folder's listing, "made no progress", for good.
    /// Its token goes on.
    #[tokio::test]
    async fn empty_pages_that_are_not_the_last_are_followed() {
        let f = Arc::new(FaultyStore::new(
            Arc::new(object_store::memory::InMemory::new()),
            FaultConfig::default(),
        ));
        for i in 0..30 {
            f.put(&Path::from(format!("vm/k{i:03}")), vec![1u8].into())
                .await
                .expect("put");
        }
        f.set_config(FaultConfig {
            list_page_keys: 10,
            empty_list_pages: 3,
            ..FaultConfig::default()
        });
        let mut store = BackingStore::new(
            f.clone() as Arc<dyn ObjectStore>,
            "paged",
            RetryPolicy::default(),
        );
        store.paged = Some(Arc::new(PagedLister::new(f.clone(), "")));
        let listed = store.list_dir("vm").await.expect("listed");
        assert_eq!(listed.files.len(), 30);
    }
}
