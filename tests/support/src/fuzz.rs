//! A fuzzer's parts: hostile requests sent and judged (every answer a 4xx problem document,
//! or Spin's empty 404 where no route matches), hostile values and mutations of a body, and
//! a snapshot of everything the app stores, to show that nothing changed.

use std::collections::BTreeMap;
use std::time::Duration;

use api_client::Client;
use serde_json::{Value, json};

use crate::app::App;
use crate::paths::workspace;
use crate::random::Rng;

pub const SQL_METACHARACTERS: [&str; 8] = [
    "' OR 1=1 --",
    "\"; DROP TABLE orgs; --",
    "'); DELETE FROM reservations; --",
    "x' UNION SELECT secret_hash FROM api_keys --",
    "%' OR '%'='",
    "\\'; PRAGMA writable_schema=1; --",
    "1; ATTACH DATABASE '/tmp/x' AS x; --",
    "`~!@#$%^&*()_+-={}|[]\\:\";'<>?,./",
];

/// Ids that name nothing: as they appear in a URL path (already percent-encoded where needed).
pub fn hostile_ids() -> Vec<String> {
    let mut ids: Vec<String> = [
        "..",
        ".",
        "...",
        "%2e%2e",
        "..%2F..%2Fetc%2Fpasswd",
        "a%2Fb",
        "%2F",
        "a/b",
        "%00",
        "n0%00",
        "%C3%BCn%C3%AF",
        "%F0%9F%92%A5",
        "%FF%FE",
        "%27%20OR%201%3D1%20--",
        "%22%3B%20DROP%20TABLE%20orgs%3B%20--",
        "n0%27--",
        "n0%20",
        "%20n0",
        "-n0",
        "n0;",
        "*",
        "%25",
        "n0%0A",
        "a%5Cb",
        "n0%3Fx%3D1",
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect();
    ids.push("x".repeat(10 * 1024));
    ids
}

#[derive(Debug, Clone, Copy)]
pub enum Expect {
    /// Any 4xx.
    Refused,
    /// Exactly this status, with this problem code if given.
    Problem(u16, Option<&'static str>),
    /// Spin's own empty 404: the path matches no route of spin.toml (an id with a `/` in it
    /// makes a path no component serves).
    NoRoute,
}

pub struct Fuzz {
    pub base: String,
    /// spin.toml's routes, as the host matches them.
    router: spin_host::routes::Router,
    pub tried: usize,
    pub by_status: BTreeMap<u16, usize>,
    pub failures: Vec<String>,
}

pub type Answer = Result<(u16, Option<String>, Vec<u8>), String>;

impl Fuzz {
    pub fn new(base: &str) -> Fuzz {
        let manifest =
            spin_host::manifest::Manifest::load(&workspace().join("spin.toml")).expect("spin.toml");
        Fuzz {
            base: base.to_owned(),
            router: spin_host::routes::Router::for_manifest(&manifest).expect("spin.toml's routes"),
            tried: 0,
            by_status: BTreeMap::new(),
            failures: Vec::new(),
        }
    }

    pub fn send(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &[u8])],
        body: Option<&[u8]>,
    ) -> Answer {
        let mut client = Client::new(&self.base, None);
        for (name, value) in headers {
            client = client.with_raw_header(name, value)?;
        }
        let reply = client.try_send(method, path, None, body)?;
        let content_type = reply.header("content-type").map(str::to_owned);
        Ok((reply.status, content_type, reply.body))
    }

    /// Sends one hostile request and checks the answer.
    #[allow(clippy::too_many_arguments)]
    pub fn attack(
        &mut self,
        what: &str,
        token: &str,
        method: &str,
        path: &str,
        content_type: Option<&str>,
        body: Option<&[u8]>,
        expect: Expect,
    ) {
        let authorization = format!("Bearer {token}");
        let mut headers: Vec<(&str, &[u8])> = vec![("authorization", authorization.as_bytes())];
        if let Some(content_type) = content_type {
            headers.push(("content-type", content_type.as_bytes()));
        }
        self.attack_with_headers(what, method, path, &headers, body, expect);
    }

    pub fn attack_with_headers(
        &mut self,
        what: &str,
        method: &str,
        path: &str,
        headers: &[(&str, &[u8])],
        body: Option<&[u8]>,
        expect: Expect,
    ) {
        self.tried += 1;
        let path_only = path.split('?').next().unwrap_or(path);
        let expect = if self.router.route(path_only).is_some() {
            expect
        } else {
            Expect::NoRoute
        };
        let shown_path: String = path.chars().take(120).collect();
        let what = format!("{what}: {method} {shown_path}");
        match self.send(method, path, headers, body) {
            Err(e) => self.failures.push(format!("{what}: {e}")),
            Ok((status, content_type, body)) => {
                *self.by_status.entry(status).or_default() += 1;
                if let Some(problem) = judge(status, content_type.as_deref(), &body, expect) {
                    let text: String = String::from_utf8_lossy(&body).chars().take(300).collect();
                    self.failures
                        .push(format!("{what}: {problem} (answered {status} {text})"));
                }
            }
        }
    }
}

/// What is wrong with an answer, if anything.
pub fn judge(
    status: u16,
    content_type: Option<&str>,
    body: &[u8],
    expect: Expect,
) -> Option<String> {
    if let Expect::NoRoute = expect {
        return (status != 404 || content_type.is_some() || !body.is_empty())
            .then(|| "not Spin's empty 404 for a path no route matches".into());
    }
    if !(400..500).contains(&status) {
        return Some("not a 4xx".into());
    }
    if content_type != Some("application/problem+json") {
        return Some(format!("content type {content_type:?}"));
    }
    let Ok(problem) = serde_json::from_slice::<Value>(body) else {
        return Some("not JSON".into());
    };
    if problem["status"] != status || !problem["code"].is_string() {
        return Some("not a problem document".into());
    }
    match expect {
        Expect::Refused | Expect::NoRoute => None,
        Expect::Problem(wanted, code) => {
            if status != wanted {
                return Some(format!("expected {wanted}"));
            }
            match code {
                Some(code) if problem["code"] != code => Some(format!("expected code {code}")),
                _ => None,
            }
        }
    }
}

/// Everything the app stores: every table of the database and the key-value store, row by
/// row. The health probe's key and what the store remembers of its site (a cache any request
/// may refresh) are the only entries requests may touch.
pub fn snapshot(app: &App) -> BTreeMap<String, Vec<String>> {
    let mut tables = BTreeMap::new();
    let db = app.db();
    let names: Vec<String> = db
        .prepare("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    for name in names
        .iter()
        .chain(std::iter::once(&"sqlite_master".to_owned()))
    {
        tables.insert(
            name.clone(),
            all_rows(&db, &format!("SELECT * FROM \"{name}\"")),
        );
    }
    let version: i64 = db
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .unwrap();
    tables.insert("user_version".into(), vec![version.to_string()]);
    let kv = rusqlite::Connection::open(app.state_dir().join("sqlite_key_value.db")).unwrap();
    kv.busy_timeout(Duration::from_secs(10)).unwrap();
    tables.insert(
        "key-value".into(),
        all_rows(
            &kv,
            // Less what each cell's store remembers of its database once it first asks,
            // whichever request that is.
            &format!(
                "SELECT * FROM spin_key_value WHERE key NOT LIKE '{}'",
                reservations_store::site::site_memory_key("%")
            ),
        ),
    );
    tables
}

pub fn all_rows(db: &rusqlite::Connection, sql: &str) -> Vec<String> {
    let mut statement = db.prepare(sql).unwrap();
    let width = statement.column_count();
    let mut rows: Vec<String> = statement
        .query_map([], |row| {
            let values: Vec<String> = (0..width)
                .map(|i| format!("{:?}", row.get_ref(i).unwrap()))
                .collect();
            Ok(values.join("|"))
        })
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    rows.sort();
    rows
}

pub fn assert_unchanged(
    before: &BTreeMap<String, Vec<String>>,
    after: &BTreeMap<String, Vec<String>>,
) {
    for (table, rows) in after {
        assert_eq!(
            before.get(table),
            Some(rows),
            "hostile input changed table {table}"
        );
    }
    assert_eq!(
        before.keys().collect::<Vec<_>>(),
        after.keys().collect::<Vec<_>>()
    );
}

/// `{"field": value, ...rest of the body}`: the body with `field` (again) in front.
pub fn with_leading_member(body: &str, field: &str, value: &str) -> String {
    let rest = &body[1..];
    let separator = if rest.starts_with('}') { "" } else { "," };
    format!("{{\"{field}\":{value}{separator}{rest}")
}

/// A value of the wrong type for a field.
pub fn wrong_type(rng: &mut Rng, is_list: bool) -> Value {
    if is_list {
        rng.pick(&[
            json!("g0"),
            json!(7),
            json!({}),
            json!([1]),
            json!([null]),
            json!([["g0"]]),
            json!(true),
        ])
        .clone()
    } else {
        rng.pick(&[
            json!(7),
            json!(-1.5),
            json!(true),
            json!({}),
            json!([]),
            json!(["x"]),
        ])
        .clone()
    }
}

pub fn insert_byte(text: &str, rng: &mut Rng, byte: u8) -> Vec<u8> {
    let mut bytes = text.as_bytes().to_vec();
    let at = 1 + rng.below(bytes.len() - 1);
    bytes.insert(at, byte);
    bytes
}

/// The request with `Connection: close` after its `Host` header, if it has one.
pub fn with_connection_close(request: &[u8]) -> Vec<u8> {
    const HOST: &[u8] = b"Host: x\r\n";
    match request.windows(HOST.len()).position(|w| w == HOST) {
        Some(at) => [
            &request[..at + HOST.len()],
            b"Connection: close\r\n",
            &request[at + HOST.len()..],
        ]
        .concat(),
        None => request.to_vec(),
    }
}
