//! Bearer tokens: `gpr.<key id>.<secret>`, org keys' ids starting `key-` and operator keys'
//! `opk-`. Only the SHA-256 of the 256-bit secret is stored, and comparisons take the same
//! time whatever the bytes.

use reservations_domain::access::Caller;
use reservations_store::Store;
use sha2::{Digest, Sha256};

use crate::problem::Problem;

const TOKEN_PREFIX: &str = "gpr";
const ORG_KEY_ID_PREFIX: &str = "key-";
const OPERATOR_KEY_ID_PREFIX: &str = "opk-";
/// The key id under which the bootstrap operator credential acts.
pub const OPERATOR_KEY_ID: &str = "operator";

/// A freshly generated key: the token is shown once, only the hash is kept.
pub struct IssuedKey {
    pub id: String,
    pub token: String,
    pub secret_hash: String,
}

pub fn random_hex(bytes: usize) -> String {
    let mut buffer = vec![0u8; bytes];
    getrandom::fill(&mut buffer).expect("the platform provides randomness");
    hex::encode(buffer)
}

/// A key of an org.
pub fn issue_key() -> IssuedKey {
    issue(ORG_KEY_ID_PREFIX)
}

/// A key of a platform operator.
pub fn issue_operator_key() -> IssuedKey {
    issue(OPERATOR_KEY_ID_PREFIX)
}

fn issue(id_prefix: &str) -> IssuedKey {
    let id = format!("{id_prefix}{}", random_hex(8));
    let secret = random_hex(32);
    IssuedKey {
        token: format!("{TOKEN_PREFIX}.{id}.{secret}"),
        secret_hash: hash_secret(&secret),
        id,
    }
}

pub fn hash_secret(secret: &str) -> String {
    hex::encode(Sha256::digest(secret.as_bytes()))
}

/// Equal-length byte strings compared without an early exit.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The token of an `Authorization: Bearer <token>` header (RFC 6750 syntax), or why not.
pub fn bearer_token(header: Option<&str>) -> Result<&str, Problem> {
    let header =
        header.ok_or_else(|| Problem::unauthorized("send Authorization: Bearer <token>"))?;
    let (scheme, token) = header.split_once(' ').ok_or_else(|| {
        Problem::unauthorized("the Authorization header must be 'Bearer <token>'")
    })?;
    if !scheme.eq_ignore_ascii_case("bearer") {
        return Err(Problem::unauthorized("only the Bearer scheme is accepted"));
    }
    let is_token_char = |c: char| c.is_ascii_alphanumeric() || "-._~+/".contains(c);
    let body = token.trim_end_matches('=');
    if body.is_empty() || !body.chars().all(is_token_char) {
        return Err(Problem::unauthorized("the bearer token is malformed"));
    }
    Ok(token)
}

/// Who a token belongs to. Every failure is the same 401, so a caller learns nothing about
/// which keys exist.
pub fn authenticate(
    store: &Store<'_>,
    token: &str,
    operator_token: &str,
) -> Result<Caller, Problem> {
    let refused = || Problem::unauthorized("the token is unknown or revoked");
    if constant_time_eq(
        hash_secret(token).as_bytes(),
        hash_secret(operator_token).as_bytes(),
    ) {
        return Ok(Caller::operator(OPERATOR_KEY_ID));
    }
    let mut parts = token.splitn(3, '.');
    let (Some(TOKEN_PREFIX), Some(key_id), Some(secret)) =
        (parts.next(), parts.next(), parts.next())
    else {
        return Err(refused());
    };
    let secret_matches = |stored_hash: &str| {
        constant_time_eq(hash_secret(secret).as_bytes(), stored_hash.as_bytes())
    };
    if key_id.starts_with(OPERATOR_KEY_ID_PREFIX) {
        let Some((key, stored_hash)) = store
            .identity()
            .operator_key_with_secret_hash(key_id)
            .map_err(Problem::from)?
        else {
            return Err(refused());
        };
        if key.revoked_at.is_some() || !secret_matches(&stored_hash) {
            return Err(refused());
        }
        return Ok(Caller::operator(key.id));
    }
    let Some((key, stored_hash)) = store
        .identity()
        .key_with_secret_hash(key_id)
        .map_err(Problem::from)?
    else {
        return Err(refused());
    };
    if key.revoked_at.is_some() || !secret_matches(&stored_hash) {
        return Err(refused());
    }
    Ok(Caller {
        key_id: key.id.clone(),
        org_id: Some(key.org_id.clone()),
        permissions: key.effective_permissions(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bearer_syntax() {
        assert_eq!(bearer_token(Some("Bearer abc.def")).unwrap(), "abc.def");
        assert_eq!(bearer_token(Some("bearer abc")).unwrap(), "abc");
        for bad in [
            None,
            Some(""),
            Some("Bearer"),
            Some("Bearer "),
            Some("Bearer  abc"),
            Some("Basic abc"),
            Some("Bearer abc def"),
            Some("Bearer abc\t"),
            Some("Token abc"),
        ] {
            let problem = bearer_token(bad).unwrap_err();
            assert_eq!(problem.status, 401, "{bad:?}");
        }
    }

    #[test]
    fn constant_time_eq_compares() {
        assert!(constant_time_eq(b"abc", b"abc"));
        assert!(!constant_time_eq(b"abc", b"abd"));
        assert!(!constant_time_eq(b"abc", b"ab"));
    }
}
