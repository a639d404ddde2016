//! What an endpoint reads from its request and what it answers. Its handler works with the
//! [`Call`], names each part it reads as a type in its signature — the ids in the path
//! ([`Path`]), the query ([`Query`]) and the JSON body ([`Json`], [`JsonOrDefault`]), each
//! parsed strictly before the handler runs, in the order the handler lists them, every
//! refusal a [`Problem`] naming what is wrong — and answers an [`Answer`]: the read or the
//! write it asks for, as a value:
//!
//! ```
//! use reservations_domain::ids::{Id, Vm};
//! use reservations_http::input::{NoQuery, Path, Query};
//! use reservations_http::{Call, Problem, Read};
//!
//! fn get(_: &Call<'_>, Path(id): Path<Id<Vm>>, _: Query<NoQuery>) -> Result<Read, Problem> {
//!     Ok(Read::Vm(id))
//! }
//! ```

use std::fmt;

use reservations_domain::Timestamp;
use reservations_domain::access::Caller;
use reservations_domain::ids::{Id, Kind, Node, Reservation};
use reservations_domain::time::parse_rfc3339;
use serde::de::{self, DeserializeOwned, IntoDeserializer, Visitor};
use serde::{Deserialize, Deserializer};
use spin_sdk::http::Request;

use crate::operation::Operation;
use crate::problem::Problem;
use crate::read::Read;
use crate::routes::PathParams;
use crate::routes::RequestIds;

/// A part of the request an endpoint reads, taken from the call before its handler runs.
pub trait Input: Sized {
    fn take(call: &Call<'_>) -> Result<Self, Problem>;
}

/// A function that serves an authenticated endpoint: the call, then the inputs it reads.
/// [`crate::routes!`] binds such functions to the table.
/// It answers a [`Read`] or an [`crate::operation::Operation`] (a write).
pub trait Handler<Inputs> {
    fn serve(&self, call: &Call<'_>) -> Result<Answer, Problem>;
}

impl<F, R> Handler<((), R)> for F
where
    F: Fn(&Call<'_>) -> Result<R, Problem>,
    R: Into<Answer>,
{
    fn serve(&self, call: &Call<'_>) -> Result<Answer, Problem> {
        self(call).map(Into::into)
    }
}

macro_rules! handler_with_inputs {
    ($($input:ident),+) => {
        impl<F, R, $($input: Input),+> Handler<(($($input,)+), R)> for F
        where
            F: Fn(&Call<'_>, $($input),+) -> Result<R, Problem>,
            R: Into<Answer>,
        {
            fn serve(&self, call: &Call<'_>) -> Result<Answer, Problem> {
                self(call, $($input::take(call)?),+).map(Into::into)
            }
        }
    };
}

handler_with_inputs!(A);
handler_with_inputs!(A, B);
handler_with_inputs!(A, B, C);

// ---------------------------------------------------------------- path

/// The ids in the path. A parameter that is not a valid id cannot name anything, so it is
/// answered like a missing object (404).
pub struct Path<P>(pub P);

/// What a path's parameters are read into.
pub trait FromPath: Sized {
    fn from_path(params: &PathParams) -> Result<Self, Problem>;
}

impl<P: FromPath> Input for Path<P> {
    fn take(call: &Call<'_>) -> Result<Self, Problem> {
        P::from_path(call.params).map(Path)
    }
}

fn not_found<T: Kind>() -> Problem {
    Problem::not_found(format!("{} not found", T::NAME))
}

/// The path parameter `name`, an id of a `T`.
pub fn id_in_path<T: Kind>(params: &PathParams, name: &str) -> Result<Id<T>, Problem> {
    params
        .get(name)
        .and_then(Id::parse)
        .ok_or_else(not_found::<T>)
}

/// The path's one parameter, an id of a `T`.
impl<T: Kind> FromPath for Id<T> {
    fn from_path(params: &PathParams) -> Result<Self, Problem> {
        params.only().and_then(Id::parse).ok_or_else(not_found::<T>)
    }
}

/// `/v1/nodes/:nodeId/reservations/:id/...`: a reservation and the node it is on.
pub struct ReservationPath {
    pub node_id: Id<Node>,
    pub id: Id<Reservation>,
}

impl FromPath for ReservationPath {
    fn from_path(params: &PathParams) -> Result<Self, Problem> {
        // A node id that cannot be one names no reservation either.
        let node_id = id_in_path::<Node>(params, "nodeId").map_err(|_| not_found::<Reservation>());
        Ok(ReservationPath {
            node_id: node_id?,
            id: id_in_path(params, "id")?,
        })
    }
}

// ---------------------------------------------------------------- body

/// The JSON body, parsed strictly: JSON content type (415), well-formed JSON of the right
/// shape with no unknown fields (400 naming the field). Its size was checked as it was read.
pub struct Json<B>(pub B);

impl<B: DeserializeOwned> Input for Json<B> {
    fn take(call: &Call<'_>) -> Result<Self, Problem> {
        parse_json_body(call.request, call.body).map(Json)
    }
}

/// Like [`Json`], but a request without a body means the default.
pub struct JsonOrDefault<B>(pub B);

impl<B: DeserializeOwned + Default> Input for JsonOrDefault<B> {
    fn take(call: &Call<'_>) -> Result<Self, Problem> {
        if call.body.is_empty() && call.request.header("content-type").is_none() {
            return Ok(JsonOrDefault(B::default()));
        }
        parse_json_body(call.request, call.body).map(JsonOrDefault)
    }
}

// ---------------------------------------------------------------- query

/// The query, read into `Q`, a struct whose fields are the parameters the endpoint takes:
/// any other parameter is a 400 naming it, as is one given twice that is not a list, or a
/// value its type refuses. A list field (`Vec<_>`) takes every value of its parameter.
pub struct Query<Q>(pub Q);

impl<Q: DeserializeOwned> Input for Query<Q> {
    fn take(call: &Call<'_>) -> Result<Self, Problem> {
        parse_query(call.request.query()).map(Query)
    }
}

/// The query of an endpoint that takes no parameters.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NoQuery {}

/// Reads `query` (`a=1&b=2`, percent-decoded) into `Q`.
pub fn parse_query<Q: DeserializeOwned>(query: &str) -> Result<Q, Problem> {
    let pairs = form_urlencoded::parse(query.as_bytes())
        .map(|(name, value)| (name.into_owned(), value.into_owned()))
        .collect();
    Q::deserialize(Parameters { pairs }).map_err(Refusal::into_problem)
}

/// The query's pairs, as a deserializer of the struct that names the parameters.
struct Parameters {
    pairs: Vec<(String, String)>,
}

impl<'de> Deserializer<'de> for Parameters {
    type Error = Refusal;

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Refusal> {
        if let Some((unknown, _)) = self
            .pairs
            .iter()
            .find(|(n, _)| !fields.contains(&n.as_str()))
        {
            return Err(Refusal::Problem(
                Problem::bad_request(
                    "unknown-parameter",
                    format!(
                        "unknown query parameter {unknown:?}; allowed: {}",
                        fields.join(", ")
                    ),
                )
                .with("parameter", unknown.clone()),
            ));
        }
        let mut grouped: Vec<(String, Vec<String>)> = Vec::new();
        for (name, value) in self.pairs {
            match grouped.iter_mut().find(|(n, _)| *n == name) {
                Some((_, values)) => values.push(value),
                None => grouped.push((name, vec![value])),
            }
        }
        visitor.visit_map(Grouped {
            parameters: grouped.into_iter(),
            next: None,
        })
    }

    fn deserialize_any<V: Visitor<'de>>(self, _visitor: V) -> Result<V::Value, Refusal> {
        Err(de::Error::custom("a query is read into a struct"))
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf
        option unit unit_struct newtype_struct seq tuple tuple_struct map enum identifier
        ignored_any
    }
}

/// The parameters one by one, each with all its values.
struct Grouped {
    parameters: std::vec::IntoIter<(String, Vec<String>)>,
    next: Option<(String, Vec<String>)>,
}

impl<'de> de::MapAccess<'de> for Grouped {
    type Error = Refusal;

    fn next_key_seed<K: de::DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, Refusal> {
        let Some((name, values)) = self.parameters.next() else {
            return Ok(None);
        };
        let key = seed.deserialize(name.as_str().into_deserializer())?;
        self.next = Some((name, values));
        Ok(Some(key))
    }

    fn next_value_seed<V: de::DeserializeSeed<'de>>(
        &mut self,
        seed: V,
    ) -> Result<V::Value, Refusal> {
        let (name, values) = self.next.take().expect("a value follows its key");
        seed.deserialize(Values {
            name: &name,
            values,
        })
        .map_err(|refusal| refusal.naming(&name))
    }
}

/// The values of one parameter: one, unless it is read into a list.
struct Values<'n> {
    name: &'n str,
    values: Vec<String>,
}

impl Values<'_> {
    fn single(mut self) -> Result<String, Refusal> {
        if self.values.len() > 1 {
            return Err(Refusal::Problem(
                Problem::bad_request(
                    "repeated-parameter",
                    format!("query parameter {:?} may appear once", self.name),
                )
                .with("parameter", self.name),
            ));
        }
        Ok(self.values.pop().unwrap_or_default())
    }
}

impl<'de> Deserializer<'de> for Values<'_> {
    type Error = Refusal;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Refusal> {
        visitor.visit_string(self.single()?)
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Refusal> {
        visitor.visit_some(self)
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        visitor: V,
    ) -> Result<V::Value, Refusal> {
        visitor.visit_newtype_struct(self)
    }

    fn deserialize_seq<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Refusal> {
        visitor.visit_seq(de::value::SeqDeserializer::new(self.values.into_iter()))
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _variants: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Refusal> {
        visitor.visit_enum(self.single()?.into_deserializer())
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf
        unit unit_struct tuple tuple_struct map struct identifier ignored_any
    }
}

/// Why a query was refused: a problem already (an unknown or repeated parameter), or a
/// value's own refusal, which becomes one naming the parameter.
#[derive(Debug)]
enum Refusal {
    Problem(Problem),
    Value(String),
}

impl Refusal {
    fn naming(self, parameter: &str) -> Refusal {
        match self {
            Refusal::Value(message) => Refusal::Problem(
                Problem::bad_request("invalid-parameter", format!("{parameter}: {message}"))
                    .with("parameter", parameter),
            ),
            problem => problem,
        }
    }

    fn into_problem(self) -> Problem {
        match self {
            Refusal::Problem(problem) => problem,
            Refusal::Value(message) => Problem::bad_request("invalid-parameter", message),
        }
    }
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refusal::Problem(problem) => write!(f, "{problem:?}"),
            Refusal::Value(message) => f.write_str(message),
        }
    }
}

impl std::error::Error for Refusal {}

impl de::Error for Refusal {
    fn custom<T: fmt::Display>(message: T) -> Self {
        Refusal::Value(message.to_string())
    }
}

// ---------------------------------------------------------------- query values

/// A value read from the text of a query parameter; `Err` says what it must be.
pub trait FromText: Sized {
    fn from_text(text: &str) -> Result<Self, String>;
}

/// Deserializes a [`FromText`] value from a string.
pub fn from_text<'de, D: Deserializer<'de>, T: FromText>(deserializer: D) -> Result<T, D::Error> {
    let text = String::deserialize(deserializer)?;
    T::from_text(&text).map_err(de::Error::custom)
}

/// Implements `Deserialize` for [`FromText`] types, so that query structs can hold them.
#[macro_export]
macro_rules! deserialize_from_text {
    ($($value:ty),+ $(,)?) => {$(
        impl<'de> serde::Deserialize<'de> for $value {
            fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                $crate::input::from_text(deserializer)
            }
        }
    )+};
}

/// How many items a page holds: 1 to `MAX`, `DEFAULT` when the query does not say.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limit<const DEFAULT: usize, const MAX: usize>(usize);

impl<const DEFAULT: usize, const MAX: usize> Limit<DEFAULT, MAX> {
    pub fn get(self) -> usize {
        self.0
    }
}

impl<const DEFAULT: usize, const MAX: usize> Default for Limit<DEFAULT, MAX> {
    fn default() -> Self {
        Limit(DEFAULT)
    }
}

impl<const DEFAULT: usize, const MAX: usize> FromText for Limit<DEFAULT, MAX> {
    fn from_text(text: &str) -> Result<Self, String> {
        match text.parse::<usize>() {
            Ok(n) if (1..=MAX).contains(&n) => Ok(Limit(n)),
            _ => Err(format!("must be an integer from 1 to {MAX}")),
        }
    }
}

impl<'de, const DEFAULT: usize, const MAX: usize> Deserialize<'de> for Limit<DEFAULT, MAX> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        from_text(deserializer)
    }
}

/// Where a listing resumes: the `nextCursor` of its previous page, opaque to the caller and
/// read by the listing itself.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(transparent)]
pub struct Cursor(String);

impl Cursor {
    /// Where this cursor resumes `listing`: 400 for anything that is not a cursor of that
    /// listing (another listing's, or one naming an object, existing or not, by its id alike).
    pub fn position_in(
        &self,
        listing: &reservations_store::cursor::Listing,
    ) -> Result<reservations_store::cursor::Position, Problem> {
        listing.position(&self.0).ok_or_else(not_this_listing)
    }

    /// The key this cursor resumes `listing` after, for a listing ordered by a key: 400 for
    /// anything that is not a cursor of that listing, as [`Cursor::position_in`].
    pub fn key_in(&self, listing: &reservations_store::cursor::Listing) -> Result<String, Problem> {
        listing.key(&self.0).ok_or_else(not_this_listing)
    }
}

fn not_this_listing() -> Problem {
    Problem::bad_request(
        "invalid-parameter",
        "cursor must be a nextCursor of this listing",
    )
    .with("parameter", "cursor")
}

/// An instant, RFC 3339 with any offset (kept to the millisecond).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Time(pub Timestamp);

impl FromText for Time {
    fn from_text(text: &str) -> Result<Self, String> {
        parse_rfc3339(text)
            .map(Time)
            .ok_or_else(|| "must be an RFC 3339 time, e.g. 2026-01-31T12:00:00Z".to_owned())
    }
}

/// A query parameter naming a node: a valid id (else the filter could match nothing and look
/// like an empty listing).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeFilter(pub Id<Node>);

impl FromText for NodeFilter {
    fn from_text(text: &str) -> Result<Self, String> {
        Id::parse(text)
            .map(NodeFilter)
            .ok_or_else(|| "must be a valid id".to_owned())
    }
}

deserialize_from_text!(Time, NodeFilter);

/// Everything a handler of an authenticated endpoint works with.
pub struct Call<'a> {
    pub request: &'a Request,
    pub(crate) params: &'a PathParams,
    pub ids: &'a RequestIds,
    pub now: Timestamp,
    pub caller: &'a Caller,
    /// The request body, read after authentication and within the endpoint's limit.
    pub(crate) body: &'a [u8],
}

/// What a handler answers: the read or the write it asks for, as a value the executor
/// answers or carries out ([`crate::execute`]).
pub enum Answer {
    Read(Read),
    Write(Operation),
}

impl From<Read> for Answer {
    fn from(read: Read) -> Answer {
        Answer::Read(read)
    }
}

impl From<Operation> for Answer {
    fn from(operation: Operation) -> Answer {
        Answer::Write(operation)
    }
}

/// For an optional member of a request body, with `#[serde(default, deserialize_with =
/// "not_null")]`: absent means `None`, but an explicit `null` is refused like any other wrong
/// type (400 naming the member) — no member of the contract is nullable.
pub fn not_null<'de, D, T>(deserializer: D) -> Result<Option<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: serde::Deserialize<'de>,
{
    T::deserialize(deserializer).map(Some)
}

/// `application/json`, with parameters, in UTF-8: JSON has no other encoding (RFC 8259), so a
/// `charset` naming another one cannot be what the body is parsed as. A `+json` type says the
/// body follows some other convention (a merge patch, JSON:API, a problem document), which
/// this API does not speak: it is refused, not read as plain JSON.
fn is_json_content_type(value: &str) -> bool {
    let mut parts = value.split(';');
    let is_json = parts
        .next()
        .unwrap_or("")
        .trim()
        .eq_ignore_ascii_case("application/json");
    let utf8 = parts.all(|parameter| match parameter.split_once('=') {
        Some((name, value)) if name.trim().eq_ignore_ascii_case("charset") => {
            value.trim().trim_matches('"').eq_ignore_ascii_case("utf-8")
        }
        _ => true,
    });
    is_json && utf8
}

/// The JSON body, parsed strictly: JSON content type (415), well-formed JSON of the right
/// shape with no unknown fields (400 naming the field).
pub(crate) fn parse_json_body<T: DeserializeOwned>(
    request: &Request,
    body: &[u8],
) -> Result<T, Problem> {
    let content_type = request
        .header("content-type")
        .and_then(|v| v.as_str())
        .unwrap_or("");
    if !is_json_content_type(content_type) {
        return Err(Problem::new(
            415,
            "unsupported-media-type",
            "Unsupported media type",
            "send the body as application/json (UTF-8)",
        ));
    }
    let deserializer = &mut serde_json::Deserializer::from_slice(body);
    let value: T = serde_path_to_error::deserialize(&mut *deserializer).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        let message = inner.to_string();
        // serde names a missing field only in its message: `missing field `unitIds``.
        let missing = message
            .strip_prefix("missing field `")
            .and_then(|rest| rest.split('`').next())
            .map(|name| match path.as_str() {
                "." => name.to_owned(),
                parent => format!("{parent}.{name}"),
            });
        let code = if missing.is_some() {
            "missing-field"
        } else if message.starts_with("unknown field") {
            "unknown-field"
        } else if inner.is_syntax() || inner.is_eof() {
            "malformed-json"
        } else {
            "invalid-type"
        };
        let field = missing.unwrap_or(path);
        let mut problem = Problem::bad_request(code, format!("{field}: {message}"));
        if field != "." {
            problem = problem.with("field", field);
        }
        problem
    })?;
    // One JSON value and nothing after it but whitespace: `{...}garbage` is malformed.
    deserializer.end().map_err(|e| {
        Problem::bad_request(
            "malformed-json",
            format!("trailing characters after the JSON value: {e}"),
        )
    })?;
    Ok(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields, rename_all = "camelCase")]
    struct Listing {
        node_id: Option<String>,
        #[serde(default)]
        status: Vec<String>,
        cursor: Option<Cursor>,
        #[serde(default)]
        limit: Limit<50, 500>,
        since: Option<Time>,
    }

    fn refused(query: &str) -> (String, Option<String>) {
        let problem = parse_query::<Listing>(query).expect_err(query);
        let parameter = problem.extra.get("parameter").and_then(|p| p.as_str());
        (problem.code.to_owned(), parameter.map(str::to_owned))
    }

    #[test]
    fn a_query_reads_into_its_struct() {
        let listing: Listing = parse_query(
            "nodeId=n%201&status=a&status=b&limit=7&cursor=c&since=2026-01-01T00:00:00Z",
        )
        .expect("parses");
        assert_eq!(listing.node_id.as_deref(), Some("n 1"));
        assert_eq!(listing.status, ["a", "b"]);
        assert_eq!(listing.limit.get(), 7);
        assert_eq!(listing.cursor.map(|c| c.0), Some("c".to_owned()));
        assert!(listing.since.is_some());
        let empty: Listing = parse_query("").expect("parses");
        assert_eq!(empty.limit.get(), 50);
        assert!(empty.node_id.is_none() && empty.status.is_empty());
    }

    #[test]
    fn a_query_names_what_it_refuses() {
        let unknown = ("unknown-parameter".to_owned(), Some("sort".to_owned()));
        assert_eq!(refused("limit=1&sort=x"), unknown);
        let repeated = ("repeated-parameter".to_owned(), Some("limit".to_owned()));
        assert_eq!(refused("limit=1&limit=2"), repeated);
        for bad in ["limit=0", "limit=501", "limit=x", "limit="] {
            let invalid = ("invalid-parameter".to_owned(), Some("limit".to_owned()));
            assert_eq!(refused(bad), invalid, "{bad}");
        }
        let time = ("invalid-parameter".to_owned(), Some("since".to_owned()));
        assert_eq!(refused("since=yesterday"), time);
        assert_eq!(parse_query::<NoQuery>("").map(|_| ()).ok(), Some(()));
        assert!(parse_query::<NoQuery>("x=1").is_err());
    }
}
