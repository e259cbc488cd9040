//! Path tokenizer: splits a path into a *template* (its literal text with typed
//! placeholders) and the *fields* that vary between the files of one dataset.
//!
//! `train/n01440764/n01440764_10026.JPEG` becomes template `train/n{n}/n{n}_{n}.JPEG`
//! with fields `[1440764 (8 digits, zero padded), 1440764 (padded), 10026]`; its
//! [`TokenizedPath::pattern`] keeps the widths: `train/n{n:08}/n{n:08}_{n}.JPEG`.
//!
//! Field kinds:
//! - `{d}` a calendar date `YYYY-MM-DD` (value: days since 1970-01-01, so the next
//!   partition is `value + 1` across month and year ends);
//! - `{n}` a run of ASCII digits (value: the number; width and zero padding are kept on
//!   the field so a prediction is written the way the dataset writes its names);
//! - `{h}` an opaque token: a hex-looking run of 8+ characters mixing digits and
//!   `a-f` (content hashes, UUID parts) or a digit run too long for `u64`. Opaque fields
//!   are never extrapolated: they only keep hash-named files from making one template
//!   per file.
//!
//! The template key ignores widths on purpose: `part-0999` and `part-1000`, or `img_99`
//! and `img_100`, belong to the same stream. `-of-N` totals (`model-00003-of-00008`) are
//! recognised so a predictor can stop at `N`.

use std::ops::Range;
use std::sync::Arc;

/// What a field holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FieldKind {
    Number,
    Date,
    Opaque,
}

/// One varying part of a path.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Field {
    pub kind: FieldKind,
    /// Number: its value; Date: days since 1970-01-01; Opaque: an FNV-1a hash of its text.
    pub value: i64,
    /// Characters as written (digits for a number).
    pub width: u8,
    /// A number written with a leading zero: predictions keep `width`.
    pub padded: bool,
}

/// A path split into template and fields.
#[derive(Debug, PartialEq, Eq)]
pub struct TokenizedPath {
    pub path: Arc<str>,
    /// Width-agnostic template key: literal text with `{n}`, `{d}`, `{h}` placeholders.
    pub template: Arc<str>,
    pub fields: Vec<Field>,
    /// Byte range of each field in `path`.
    pub spans: Vec<Range<usize>>,
    /// `(index, total)`: field `index` counts up to field `total` (`-of-`).
    pub of_total: Option<(usize, usize)>,
}

impl Clone for TokenizedPath {
    fn clone(&self) -> Self {
        TokenizedPath {
            path: self.path.clone(),
            template: self.template.clone(),
            fields: self.fields.clone(),
            spans: self.spans.clone(),
            of_total: self.of_total,
        }
    }

    /// Field by field, so the vectors keep their allocations (a lane takes a copy of
    /// every file it reads).
    fn clone_from(&mut self, source: &Self) {
        self.path.clone_from(&source.path);
        self.template.clone_from(&source.template);
        self.fields.clone_from(&source.fields);
        self.spans.clone_from(&source.spans);
        self.of_total = source.of_total;
    }
}

/// Longest digit run read as a number (`u64` holds 19 digits; one kept as headroom for
/// extrapolation).
const MAX_NUMBER_DIGITS: usize = 18;
/// Shortest hex-looking run treated as an opaque hash: 8 is the shortest UUID group and
/// the usual short-hash length; shorter runs like `e5` or `a1b2` are more often words.
const MIN_OPAQUE_LEN: usize = 8;

fn fnv1a(bytes: &[u8]) -> i64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h as i64
}

/// Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's algorithm).
pub fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = if y >= 0 { y } else { y - 399 } / 400;
    let yoe = y - era * 400;
    let m = i64::from(m);
    let mp = if m > 2 { m - 3 } else { m + 9 };
    let doy = (153 * mp + 2) / 5 + i64::from(d) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// Inverse of [`days_from_civil`].
pub fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = if z >= 0 { z } else { z - 146_096 } / 146_097;
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

fn digits_at(b: &[u8], at: usize, n: usize) -> Option<u32> {
    let s = b.get(at..at + n)?;
    let mut v = 0u32;
    for c in s {
        if !c.is_ascii_digit() {
            return None;
        }
        v = v * 10 + u32::from(c - b'0');
    }
    Some(v)
}

/// A valid `YYYY-MM-DD` at `i` not glued to other digits: its day number.
fn date_at(b: &[u8], i: usize) -> Option<i64> {
    if i > 0 && b[i - 1].is_ascii_digit() {
        return None;
    }
    if b.get(i + 10).is_some_and(u8::is_ascii_digit) {
        return None;
    }
    if b.get(i + 4) != Some(&b'-') || b.get(i + 7) != Some(&b'-') {
        return None;
    }
    let y = digits_at(b, i, 4)?;
    let m = digits_at(b, i + 5, 2)?;
    let d = digits_at(b, i + 8, 2)?;
    if !(1..=12).contains(&m) || !(1..=31).contains(&d) {
        return None;
    }
    let days = days_from_civil(i64::from(y), m, d);
    // Reject 2025-02-30 and friends: the round trip must give the same date back.
    (civil_from_days(days) == (i64::from(y), m, d)).then_some(days)
}

/// End of the alphanumeric run starting at `i`, if it looks like a hash.
fn opaque_run_at(b: &[u8], i: usize) -> Option<usize> {
    if i > 0 && b[i - 1].is_ascii_alphanumeric() {
        return None;
    }
    let mut j = i;
    while j < b.len() && b[j].is_ascii_alphanumeric() {
        j += 1;
    }
    let run = &b[i..j];
    let hex = run.iter().all(u8::is_ascii_hexdigit);
    let has_digit = run.iter().any(u8::is_ascii_digit);
    let has_letter = run.iter().any(u8::is_ascii_alphabetic);
    (run.len() >= MIN_OPAQUE_LEN && hex && has_digit && has_letter).then_some(j)
}

fn push_literal(key: &mut String, lit: &str) {
    // Most literals have no braces: one copy instead of a push per character.
    if !lit.bytes().any(|b| b == b'{' || b == b'}') {
        key.push_str(lit);
        return;
    }
    for c in lit.chars() {
        // Escape braces so literal text can never read as a placeholder.
        match c {
            '{' => key.push_str("{{"),
            '}' => key.push_str("}}"),
            c => key.push(c),
        }
    }
}

/// Splits `path` into template and fields. Total and allocation-light; never fails.
pub fn tokenize(path: &str) -> TokenizedPath {
    tokenize_shared(Arc::from(path))
}

/// [`tokenize`] of a path the caller already holds in an `Arc` (an access event's):
/// the result shares it instead of copying it.
pub fn tokenize_shared(path: Arc<str>) -> TokenizedPath {
    let (template, fields, spans, of_total) = split_fields(&path);
    TokenizedPath {
        path,
        template,
        fields,
        spans,
        of_total,
    }
}

type Split = (
    Arc<str>,
    Vec<Field>,
    Vec<Range<usize>>,
    Option<(usize, usize)>,
);

fn split_fields(path: &str) -> Split {
    split_fields_with::<true>(path)
}

/// [`split_fields`] into fresh buffers (see [`scan_into`]).
fn split_fields_with<const SKIP: bool>(path: &str) -> Split {
    let mut key = String::with_capacity(path.len());
    // Paths of a dataset have a few fields: one allocation each, no regrowth.
    let mut fields = Vec::with_capacity(4);
    let mut spans = Vec::with_capacity(4);
    scan_into::<SKIP>(path, &mut key, &mut fields, &mut spans);
    let of_total = of_total(path, &fields, &spans);
    (Arc::from(key), fields, spans, of_total)
}

/// Appends `path`'s template to `key` and its fields and spans to `fields` and `spans`
/// (spans relative to `path`); the buffers are the caller's, so a caller that reuses
/// them tokenizes without allocating.
///
/// With `SKIP`, bytes that cannot start a field are passed over without trying each
/// kind. A field starts with a digit (number, date) or an ASCII alphanumeric byte not
/// preceded by one (opaque run), so a byte that is not alphanumeric, or a letter right
/// after an alphanumeric byte, starts none: `date_at` needs four digits from it,
/// `opaque_run_at` an alphanumeric run starting there after a non-alphanumeric byte.
/// The result is the same either way (the test
/// `skipping_bytes_that_start_no_field_changes_nothing` compares both).
fn scan_into<const SKIP: bool>(
    path: &str,
    key: &mut String,
    fields: &mut Vec<Field>,
    spans: &mut Vec<Range<usize>>,
) {
    let b = path.as_bytes();
    let mut lit_start = 0;
    let mut i = 0;
    while i < b.len() {
        if SKIP
            && (!b[i].is_ascii_alphanumeric()
                || (b[i].is_ascii_alphabetic() && i > 0 && b[i - 1].is_ascii_alphanumeric()))
        {
            i += 1;
            continue;
        }
        let field = if let Some(days) = date_at(b, i) {
            Some((i + 10, FieldKind::Date, days, false))
        } else if let Some(j) = opaque_run_at(b, i) {
            Some((j, FieldKind::Opaque, fnv1a(&b[i..j]), false))
        } else if b[i].is_ascii_digit() {
            let mut j = i;
            while j < b.len() && b[j].is_ascii_digit() {
                j += 1;
            }
            if j - i > MAX_NUMBER_DIGITS {
                Some((j, FieldKind::Opaque, fnv1a(&b[i..j]), false))
            } else {
                let v = b[i..j]
                    .iter()
                    .fold(0i64, |v, c| v * 10 + i64::from(c - b'0'));
                Some((j, FieldKind::Number, v, b[i] == b'0' && j - i > 1))
            }
        } else {
            None
        };
        match field {
            Some((end, kind, value, padded)) => {
                // Field boundaries are ASCII bytes, so these slices are char boundaries.
                push_literal(key, &path[lit_start..i]);
                key.push_str(match kind {
                    FieldKind::Number => "{n}",
                    FieldKind::Date => "{d}",
                    FieldKind::Opaque => "{h}",
                });
                fields.push(Field {
                    kind,
                    value,
                    width: (end - i).min(usize::from(u8::MAX)) as u8,
                    padded,
                });
                spans.push(i..end);
                i = end;
                lit_start = end;
            }
            None => i += 1,
        }
    }
    push_literal(key, &path[lit_start..]);
}

/// The `-of-` pair among `fields` (see [`TokenizedPath::of_total`]).
fn of_total(path: &str, fields: &[Field], spans: &[Range<usize>]) -> Option<(usize, usize)> {
    (1..fields.len()).find_map(|t| {
        let idx = t - 1;
        let between = &path[spans[idx].end..spans[t].start];
        let numbers = fields[idx].kind == FieldKind::Number && fields[t].kind == FieldKind::Number;
        (numbers && matches!(between, "-of-" | "_of_" | "-of_" | "_of-" | "of")).then_some((idx, t))
    })
}

/// Tokenizes the entries of one directory listing with the directory scanned once.
///
/// A field never spans a `/` (no field kind contains one, and what is around a field is
/// tested only for digits and alphanumerics, which `/` is neither, like the start and
/// end of the text), so for a `name` without `/` the tokenization of `dir/name` is
/// `dir`'s fields, then `name`'s with their spans moved past `dir/`, and the template
/// of `dir`, `/`, then the template of `name` (test
/// `dir_scan_matches_tokenizing_the_whole_path`). The buffers are kept between
/// listings.
#[derive(Debug, Default)]
pub struct DirScan {
    key: String,
    fields: Vec<Field>,
    spans: Vec<Range<usize>>,
    /// Lengths of `key` and of `fields` for the directory alone, and the offset of a
    /// name in `dir/name`.
    dir_key: usize,
    dir_fields: usize,
    name_at: usize,
}

impl DirScan {
    /// Scans `dir` (`""`: entries at the root, without a `/` in front).
    pub fn start(&mut self, dir: &str) {
        self.key.clear();
        self.fields.clear();
        self.spans.clear();
        self.name_at = 0;
        if !dir.is_empty() {
            scan_into::<true>(dir, &mut self.key, &mut self.fields, &mut self.spans);
            self.key.push('/');
            self.name_at = dir.len() + 1;
        }
        self.dir_key = self.key.len();
        self.dir_fields = self.fields.len();
    }

    /// Scans `name` (no `/`) of the started directory; returns the template of
    /// `dir/name`.
    pub fn entry(&mut self, name: &str) -> &str {
        self.key.truncate(self.dir_key);
        self.fields.truncate(self.dir_fields);
        self.spans.truncate(self.dir_fields);
        scan_into::<true>(name, &mut self.key, &mut self.fields, &mut self.spans);
        for s in &mut self.spans[self.dir_fields..] {
            *s = s.start + self.name_at..s.end + self.name_at;
        }
        &self.key
    }

    /// The tokenization of `path` (`dir/name` of the last [`Self::entry`]), with
    /// `template` (an `Arc` of the text `entry` returned) shared instead of copied.
    pub fn tokenized(&self, path: Arc<str>, template: Arc<str>) -> TokenizedPath {
        TokenizedPath {
            of_total: of_total(&path, &self.fields, &self.spans),
            fields: self.fields.clone(),
            spans: self.spans.clone(),
            template,
            path,
        }
    }
}

/// Writes one field value the way the dataset writes it.
pub fn render_field(out: &mut String, kind: FieldKind, value: i64, pad_width: u8) {
    use std::fmt::Write as _;
    match kind {
        FieldKind::Date => {
            let (y, m, d) = civil_from_days(value);
            let _ = write!(out, "{y:04}-{m:02}-{d:02}");
        }
        FieldKind::Number | FieldKind::Opaque => {
            let _ = write!(out, "{value:0w$}", w = usize::from(pad_width));
        }
    }
}

impl TokenizedPath {
    /// Directory part (`""` at the root).
    pub fn dir(&self) -> &str {
        self.path.rsplit_once('/').map_or("", |(d, _)| d)
    }

    /// File name part.
    pub fn name(&self) -> &str {
        self.path.rsplit_once('/').map_or(&self.path, |(_, n)| n)
    }

    /// Directory components.
    pub fn dir_tokens(&self) -> Vec<&str> {
        self.dir().split('/').filter(|s| !s.is_empty()).collect()
    }

    /// Extension of the file name (after its last dot), if any.
    pub fn extension(&self) -> Option<&str> {
        self.name()
            .rsplit_once('.')
            .map(|(_, e)| e)
            .filter(|e| !e.is_empty())
    }

    /// Template with widths for zero-padded numbers: `shards/train-{n:06}.tar`.
    pub fn pattern(&self) -> String {
        let mut out = String::new();
        let mut at = 0;
        for (f, span) in self.fields.iter().zip(&self.spans) {
            push_literal(&mut out, &self.path[at..span.start]);
            match f.kind {
                FieldKind::Number if f.padded => out.push_str(&format!("{{n:0{}}}", f.width)),
                FieldKind::Number => out.push_str("{n}"),
                FieldKind::Date => out.push_str("{d}"),
                FieldKind::Opaque => out.push_str("{h}"),
            }
            at = span.end;
        }
        push_literal(&mut out, &self.path[at..]);
        out
    }

    /// The path with field values replaced by `values` (same length as `fields`).
    /// Unchanged fields are copied as written; changed numbers are padded to
    /// `pad[i]` digits (the widest zero-padded width seen for that field), or to their own
    /// width when written padded.
    pub fn render(&self, values: &[i64], pad: &[u8]) -> String {
        let mut out = String::with_capacity(self.path.len() + 4);
        self.render_into(&mut out, values, pad);
        out
    }

    /// [`Self::render`] appended to `out` (lets a caller reuse one buffer).
    pub fn render_into(&self, out: &mut String, values: &[i64], pad: &[u8]) {
        let mut at = 0;
        for (i, (f, span)) in self.fields.iter().zip(&self.spans).enumerate() {
            out.push_str(&self.path[at..span.start]);
            let v = values.get(i).copied().unwrap_or(f.value);
            if v == f.value {
                out.push_str(&self.path[span.clone()]);
            } else {
                let own = if f.padded { f.width } else { 0 };
                let w = own.max(pad.get(i).copied().unwrap_or(0));
                render_field(out, f.kind, v, w);
            }
            at = span.end;
        }
        out.push_str(&self.path[at..]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    proptest::proptest! {
        /// The byte skip of `split_fields` gives what trying every kind at every byte
        /// gives, on paths made of the bytes fields are built from (digits, hex and
        /// other letters, date and `-of-` separators, path separators, braces).
        #[test]
        fn skipping_bytes_that_start_no_field_changes_nothing(
            path in "[0-9a-fA-Fg-zG-Z/_.{}=-]{0,48}",
            date in "(19|20)[0-9]{2}-[01][0-9]-[0-3][0-9]",
            at in 0usize..48,
        ) {
            let mut with_date = path.clone();
            with_date.insert_str(at.min(path.len()), &date);
            for p in [path.as_str(), with_date.as_str()] {
                proptest::prop_assert_eq!(split_fields_with::<true>(p), split_fields_with::<false>(p));
            }
        }
    }

    proptest::proptest! {
        /// `DirScan` gives what tokenizing each whole `dir/name` gives, for directories
        /// scanned once and several names each, at the root too.
        #[test]
        fn dir_scan_matches_tokenizing_the_whole_path(
            dir in "([0-9a-fA-Fg-zG-Z/_.{}=-]{1,40})?",
            names in proptest::collection::vec("[0-9a-fA-Fg-zG-Z_.{}=-]{0,32}", 1..4),
            date in "(19|20)[0-9]{2}-[01][0-9]-[0-3][0-9]",
            at in 0usize..40,
            in_dir in proptest::bool::ANY,
        ) {
            let (mut dir, mut names) = (dir, names);
            if in_dir && !dir.is_empty() {
                dir.insert_str(at.min(dir.len()), &date);
            } else {
                let at = at.min(names[0].len());
                names[0].insert_str(at, &date);
            }
            names.push("part-0003-of-0008.bin".into());
            let mut scan = DirScan::default();
            scan.start("stale/2024-01-01/x1");
            scan.entry("y2");
            scan.start(&dir);
            for name in &names {
                let template: Arc<str> = Arc::from(scan.entry(name));
                let path: Arc<str> = if dir.is_empty() {
                    Arc::from(name.as_str())
                } else {
                    Arc::from(format!("{dir}/{name}"))
                };
                let got = scan.tokenized(path.clone(), template);
                proptest::prop_assert_eq!(got, tokenize_shared(path));
            }
        }
    }

    #[test]
    fn civil_days_round_trip_over_centuries() {
        let start = days_from_civil(1899, 12, 25);
        let end = days_from_civil(2101, 1, 5);
        let mut prev = civil_from_days(start);
        for z in start + 1..=end {
            let (y, m, d) = civil_from_days(z);
            assert_eq!(days_from_civil(y, m, d), z);
            // Consecutive days: same month next day, or the 1st of the next month.
            assert!(
                (y, m, d) == (prev.0, prev.1, prev.2 + 1) || (d == 1 && (m == prev.1 % 12 + 1)),
                "{prev:?} -> {:?}",
                (y, m, d)
            );
            prev = (y, m, d);
        }
        assert_eq!(days_from_civil(1970, 1, 1), 0);
        assert_eq!(civil_from_days(days_from_civil(2024, 2, 29)), (2024, 2, 29));
    }

    #[test]
    fn invalid_dates_and_glued_digits_are_numbers() {
        assert_eq!(tokenize("2025-02-30").fields[0].kind, FieldKind::Number);
        assert_eq!(tokenize("12025-01-01").fields[0].kind, FieldKind::Number);
        assert_eq!(tokenize("d=2024-02-29").fields[0].kind, FieldKind::Date);
    }

    #[test]
    fn padding_follows_the_widest_padded_width() {
        let t = tokenize("part-1000.bin");
        assert_eq!(t.render(&[0], &[4]), "part-0000.bin");
        assert_eq!(t.render(&[7], &[0]), "part-7.bin");
        let t = tokenize("part-0999.bin");
        assert_eq!(t.render(&[1000], &[]), "part-1000.bin");
    }

    #[test]
    fn braces_in_literals_cannot_forge_placeholders() {
        assert_ne!(tokenize("a{n}b").template, tokenize("a1b").template);
    }
}
