//! What a write reads of its chain, in the same statement as its facts: the [`Basis`] it
//! is planned on (the versions of the facts it read, the chain's head and its unsealed
//! tail), and the seals of that tail the write adds.

use serde::Deserialize;

use super::event::{GENESIS_HASH, HASH_VERSION, seal_link};
use crate::Store;
use crate::rows::Row;
use crate::storage::StorageError;

/// How many unsealed events of its chain one write seals at most.
const SEALS_PER_WRITE: i64 = 64;

/// What a write was planned on, read with its facts in the same statement: the version of
/// every fact the plan read, which the write statement checks, and the chain's unsealed tail,
/// which the write seals.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
pub(crate) struct Basis {
    /// `[fact, version]` for every fact the plan read (0: never written).
    pub facts: Vec<(String, i64)>,
    /// The newest place of the chain (0 for an empty chain).
    pub head: i64,
    /// The oldest unsealed events of the chain, `[chainSeq, hash]` in order.
    pub unsealed: Vec<(i64, String)>,
    /// The link of the event before the first unsealed one (none when that is the first).
    pub before: Option<String>,
}

/// A column `basis` with the [`Basis`] of a write on the chain named by `chain` (an SQL
/// expression), for the facts named by `facts`, a query of one column `fact` (each fact as
/// [`crate::facts`] names it). It costs the read no statement of its own.
///
/// The unsealed events are always the chain's newest (later writes seal them oldest first):
/// they follow its last linked place, the newest event that is sealed or of an earlier hash
/// version, found walking `audit_by_place` back from the chain's end, so the read costs
/// what the unsealed tail holds, and no index of its own has to be kept on every write.
pub(crate) fn basis_column(chain: &str, facts: &str) -> String {
    let last_linked = format!(
        "COALESCE((SELECT chain_seq FROM audit_events \
           WHERE chain = {chain} AND (seal IS NOT NULL OR hash_version <> {HASH_VERSION}) \
           ORDER BY chain_seq DESC LIMIT 1), 0)"
    );
    format!(
        "json_object(\
           'facts', json((SELECT json_group_array(json_array(f.fact, COALESCE(v.version, 0))) \
              FROM ({facts}) f LEFT JOIN fact_versions v ON v.fact = f.fact)), \
           'head', COALESCE((SELECT MAX(chain_seq) FROM audit_events WHERE chain = {chain}), 0), \
           'unsealed', json((SELECT json_group_array(json_array(t.chain_seq, t.hash)) \
              FROM (SELECT chain_seq, hash FROM audit_events \
                    WHERE chain = {chain} AND chain_seq > {last_linked} \
                    ORDER BY chain_seq LIMIT {SEALS_PER_WRITE}) t)), \
           'before', (SELECT CASE WHEN p.hash_version = {HASH_VERSION} THEN p.seal ELSE p.hash END \
              FROM audit_events p WHERE p.chain = {chain} AND p.chain_seq = {last_linked} \
                AND EXISTS (SELECT 1 FROM audit_events \
                            WHERE chain = {chain} AND chain_seq > p.chain_seq))\
         ) AS basis"
    )
}

pub(crate) fn read_basis(row: &Row<'_>) -> Result<Basis, StorageError> {
    row.json("basis")
}

impl Store<'_> {
    /// The seals of the unsealed events `basis` saw, `[chainSeq, hash, seal]`: none when the
    /// event before them has no link to seal from (the chain is broken there).
    pub(crate) fn seals_for(&self, basis: &Basis) -> Vec<(i64, String, String)> {
        let Some((first, _)) = basis.unsealed.first() else {
            return Vec::new();
        };
        let mut before = match (&basis.before, first) {
            (Some(before), _) => before.clone(),
            (None, 1) => GENESIS_HASH.to_owned(),
            (None, _) => return Vec::new(),
        };
        let mut seals = Vec::with_capacity(basis.unsealed.len());
        for (expected, (chain_seq, hash)) in (*first..).zip(&basis.unsealed) {
            if *chain_seq != expected {
                break;
            }
            let seal = seal_link(self.audit_key(), &before, *chain_seq, hash);
            seals.push((*chain_seq, hash.clone(), seal.clone()));
            before = seal;
        }
        seals
    }
}
