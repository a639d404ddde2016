//! Reading the app's answers.

use api_client::Client;
use serde_json::Value;

/// Whether an answer is a 503 that changed nothing and asks the client to send the request
/// again (`database-busy`, `write-contention`), as the contract says.
pub fn asks_for_retry(status: u16, body: &[u8]) -> bool {
    let code = serde_json::from_slice::<Value>(body).unwrap_or(Value::Null)["code"].clone();
    status == 503 && (code == "database-busy" || code == "write-contention")
}

/// Sorted strings of a JSON array, for order-insensitive comparisons.
pub fn strings(value: &Value) -> Vec<String> {
    let mut list: Vec<String> = value
        .as_array()
        .unwrap_or_else(|| panic!("not an array: {value}"))
        .iter()
        .map(|v| v.as_str().expect("string").to_owned())
        .collect();
    list.sort();
    list
}

/// The HTTP methods an OpenAPI path item may describe.
pub const METHODS: [&str; 7] = ["get", "put", "post", "delete", "patch", "head", "options"];

/// The strings sorted, for order-insensitive comparisons.
pub fn sorted<S: AsRef<str>>(list: impl IntoIterator<Item = S>) -> Vec<String> {
    let mut list: Vec<String> = list.into_iter().map(|s| s.as_ref().to_owned()).collect();
    list.sort();
    list
}

/// For each `(query, parameter)`, `path` followed by `query` is refused with a 400
/// `invalid-parameter` problem that names `parameter`.
#[track_caller]
pub fn assert_invalid_parameters(client: &Client, path: &str, cases: &[(&str, &str)]) {
    for (query, parameter) in cases {
        let problem = client
            .get(&format!("{path}{query}"))
            .expect_problem(400, "invalid-parameter");
        assert_eq!(problem["parameter"], *parameter, "{query}");
    }
}
