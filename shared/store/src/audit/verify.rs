//! Verifying the audit chains: every chain recomputed from its first event, against the
//! audit key and the pins an operator kept (docs/design.md, "The audit chains").

use reservations_domain::access::{Caller, may_verify_audit};
use serde::Serialize;

use super::seal::{SealRecord, read_seal};
use super::{
    AuditEvent, CHAINED_HASH_VERSION, COLUMNS, GENESIS_HASH, HASH_VERSION, TRAIL_CHAIN, read_event,
    seal_link,
};
use crate::storage::SqlValue;
use crate::storage::{exec, rows, text};
use crate::{Result, Trail};

/// An event an operator pinned earlier (from a previous verification): its chain must still
/// hold it, unchanged, at the same place.
#[derive(Debug, Clone, PartialEq)]
pub struct ChainPin {
    pub chain: String,
    pub seq: i64,
    pub hash: String,
}

/// The outcome of checking the chains.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ChainVerification {
    pub ok: bool,
    pub events_checked: i64,
    /// The broken chain, where it first breaks (its `chainSeq`), and why, in words.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub broken_chain: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub first_broken_seq: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub problem: Option<String>,
    /// Every chain checked, with its newest event: pin them, and a later verification given
    /// the pins also detects the deletion of events up to and including those.
    pub chains: Vec<ChainState>,
}

/// One chain as verified.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ChainState {
    pub chain: String,
    pub ok: bool,
    pub events_checked: i64,
    /// The newest event whose place is sealed, and its link (its seal, or for version 4 its
    /// hash): what to pin.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_seq: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_hash: Option<String>,
    /// How many events at the end of the chain no later write has sealed yet.
    pub unsealed: i64,
    /// For the chain of earlier builds' events: when they were sealed under the audit key.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sealed_at: Option<String>,
}

/// Where a chain's walk stands before its next event (see [`Trail::verify_audit_chains`]).
struct ChainWalk<'a> {
    expected_seq: i64,
    /// The hash of the event before.
    expected_prev: &'a str,
    previous_trail_seq: i64,
    /// The link the next seal must follow from; none once an event is unsealed.
    before: Option<&'a str>,
    /// Whether an event of the current version came before (no version 4 may follow one).
    written_unchained: bool,
}

impl Trail<'_, '_> {
    /// [`Trail::verify_audit_chains`] for a platform operator.
    pub fn verify_audit(
        &self,
        caller: &Caller,
        only: Option<&str>,
        pins: &[ChainPin],
    ) -> Result<ChainVerification> {
        may_verify_audit(caller).enforce(
            "audit trail",
            "only platform operators verify the audit chain",
        )?;
        self.verify_audit_chains(only, pins)
    }

    /// Every chain (or only `only`), each recomputed from its first event on: every hash,
    /// every link, the order of its events in the trail, the hash versions its place allows,
    /// and that the chains still hold `pins`. A row that cannot be read breaks its chain there
    /// (it is reported, never an error). The first broken chain is named.
    pub fn verify_audit_chains(
        &self,
        only: Option<&str>,
        pins: &[ChainPin],
    ) -> Result<ChainVerification> {
        let chains = match only {
            Some(chain) => vec![chain.to_owned()],
            None => {
                let result = exec(
                    self.db(),
                    "SELECT DISTINCT chain FROM audit_events ORDER BY chain",
                    &[],
                )?;
                rows(&result)
                    .map(|row| row.text("chain"))
                    .collect::<Result<Vec<_>, _>>()?
            }
        };
        let mut verification = ChainVerification {
            ok: true,
            events_checked: 0,
            broken_chain: None,
            first_broken_seq: None,
            problem: None,
            chains: Vec::new(),
        };
        for chain in &chains {
            let chain_pins: Vec<&ChainPin> = pins.iter().filter(|p| &p.chain == chain).collect();
            let (state, broken) = self.verify_chain(chain, &chain_pins)?;
            verification.events_checked += state.events_checked;
            if let Some((seq, problem)) = broken.filter(|_| verification.ok) {
                verification.ok = false;
                verification.broken_chain = Some(chain.clone());
                verification.first_broken_seq = Some(seq);
                verification.problem = Some(problem);
            }
            verification.chains.push(state);
        }
        if let Some(pin) = pins
            .iter()
            .find(|pin| !chains.contains(&pin.chain))
            .filter(|_| verification.ok && only.is_none())
        {
            verification.ok = false;
            verification.broken_chain = Some(pin.chain.clone());
            verification.first_broken_seq = Some(pin.seq);
            verification.problem = Some(format!(
                "chain {}: the pinned event {} is no longer in the chain",
                pin.chain, pin.seq
            ));
        }
        Ok(verification)
    }

    /// One chain, walked in `chain_seq` order, a thousand events per statement.
    fn verify_chain(
        &self,
        chain: &str,
        pins: &[&ChainPin],
    ) -> Result<(ChainState, Option<(i64, String)>)> {
        let mut expected_prev = GENESIS_HASH.to_owned();
        let mut expected_seq = 1;
        let mut previous_trail_seq = 0;
        let mut checked = 0;
        let mut pins_seen = 0;
        // What the next seal links to; none once an event is unsealed (all after it must be).
        let mut before = Some(GENESIS_HASH.to_owned());
        let mut unsealed = 0;
        let mut written_unchained = false;
        let mut last: Option<(i64, String)> = None;
        let seal = if chain == TRAIL_CHAIN {
            read_seal(self.db())?
        } else {
            None
        };
        let sealed_at = seal.as_ref().map(|seal| {
            reservations_domain::time::from_millis(seal.sealed_at)
                .to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
        });
        let state =
            |checked, broken: Option<(i64, String)>, last: Option<(i64, String)>, unsealed| {
                let (last_seq, last_hash) = last.unzip();
                Ok((
                    ChainState {
                        chain: chain.to_owned(),
                        ok: broken.is_none(),
                        events_checked: checked,
                        last_seq,
                        last_hash,
                        unsealed,
                        sealed_at: sealed_at.clone(),
                    },
                    broken.map(|(seq, problem)| (seq, format!("chain {chain}: {problem}"))),
                ))
            };
        loop {
            let result = exec(
                self.db(),
                &format!(
                    "SELECT {COLUMNS} FROM audit_events e WHERE e.chain = ? AND e.chain_seq >= ? \
                     ORDER BY e.chain_seq LIMIT 1000"
                ),
                &[text(chain), SqlValue::Integer(expected_seq)],
            )?;
            if result.rows.is_empty() {
                break;
            }
            for row in rows(&result) {
                checked += 1;
                let event = match read_event(row) {
                    Ok(event) => event,
                    Err(e) => {
                        let problem = format!("event {expected_seq} cannot be read: {e}");
                        return state(checked, Some((expected_seq, problem)), None, unsealed);
                    }
                };
                let problem = self.chain_problem(
                    &event,
                    ChainWalk {
                        expected_seq,
                        expected_prev: &expected_prev,
                        previous_trail_seq,
                        before: before.as_deref(),
                        written_unchained,
                    },
                    pins,
                );
                if let Some(problem) = problem {
                    return state(
                        checked,
                        Some((expected_seq.min(event.chain_seq), problem)),
                        None,
                        unsealed,
                    );
                }
                pins_seen += pins.iter().filter(|pin| pin.seq == event.chain_seq).count();
                previous_trail_seq = event.seq;
                written_unchained |= event.hash_version == HASH_VERSION;
                match event.link() {
                    Some(link) => {
                        before = Some(link.to_owned());
                        last = Some((event.chain_seq, link.to_owned()));
                    }
                    None => {
                        before = None;
                        unsealed += 1;
                    }
                }
                expected_prev = event.hash;
                expected_seq += 1;
            }
        }
        if pins_seen < pins.len() {
            let missing = pins
                .iter()
                .filter(|pin| pin.seq >= expected_seq)
                .map(|pin| pin.seq)
                .min()
                .unwrap_or(expected_seq);
            let problem = format!("the pinned event {missing} is no longer in the chain");
            return state(checked, Some((missing, problem)), None, unsealed);
        }
        if chain == TRAIL_CHAIN
            && let Some(broken) =
                self.departs_from_seal(seal.as_ref(), expected_seq - 1, &expected_prev)
        {
            return state(checked, Some(broken), None, unsealed);
        }
        state(checked, None, last, unsealed)
    }

    /// What is wrong with `event` where `walk` expects the next event of its chain, if
    /// anything: a missing place, a broken link, a move in the trail, a version its place does
    /// not allow, content that does not match its hash, an event placed before one its writer
    /// saw, a seal that does not follow from the chain before it, or a pin it does not hold.
    fn chain_problem(
        &self,
        event: &AuditEvent,
        walk: ChainWalk<'_>,
        pins: &[&ChainPin],
    ) -> Option<String> {
        let place = walk.expected_seq;
        if event.chain_seq != place {
            return Some(format!("event {place} is missing"));
        }
        if event.prev_hash != walk.expected_prev {
            return Some(format!("event {place} does not link to the one before it"));
        }
        if event.seq <= walk.previous_trail_seq {
            return Some(format!("event {place} was moved in the trail"));
        }
        let version_allowed = match event.hash_version {
            HASH_VERSION => true,
            CHAINED_HASH_VERSION => !walk.written_unchained,
            _ => false,
        };
        if !version_allowed {
            return Some(format!(
                "event {place} has hash version {}, which its place does not allow",
                event.hash_version
            ));
        }
        if event.compute_hash(self.audit_key()).as_ref() != Some(&event.hash) {
            return Some(format!("event {place}'s content does not match its hash"));
        }
        if event.hash_version == HASH_VERSION {
            if event.after_seq.is_none_or(|after| after >= place) {
                return Some(format!(
                    "event {place} sits before an event its writer had seen"
                ));
            }
            if let Some(seal) = &event.seal {
                match walk.before {
                    None => {
                        return Some(format!("event {place} is sealed after an unsealed event"));
                    }
                    Some(before)
                        if *seal != seal_link(self.audit_key(), before, place, &event.hash) =>
                    {
                        return Some(format!(
                            "event {place}'s seal does not follow from the chain before it"
                        ));
                    }
                    Some(_) => {}
                }
            }
        }
        match pins.iter().find(|pin| pin.seq == place) {
            Some(pin) if event.link() != Some(pin.hash.as_str()) => {
                Some(format!("event {} is not the pinned one", pin.seq))
            }
            _ => None,
        }
    }

    /// Where the chain of earlier builds' events, checked through `last_seq` (0 when empty)
    /// ending in `last_hash`, departs from its seal record, and how: the record is missing,
    /// was not written with the key, or the chain ends elsewhere than where it was sealed.
    fn departs_from_seal(
        &self,
        seal: Option<&SealRecord>,
        last_seq: i64,
        last_hash: &str,
    ) -> Option<(i64, String)> {
        let Some(seal) = seal else {
            return (last_seq > 0).then(|| (1, "the chain has no seal record".to_owned()));
        };
        if !seal.checks_out(self.audit_key()) {
            return Some((1, "its seal record does not match its MAC".to_owned()));
        }
        if last_seq > seal.through_seq {
            let added = seal.through_seq + 1;
            return Some((
                added,
                format!("event {added} came after the chain was sealed"),
            ));
        }
        if last_seq < seal.through_seq {
            let missing = last_seq + 1;
            return Some((missing, format!("event {missing} is missing")));
        }
        (last_hash != seal.through_hash).then(|| {
            let problem = format!("event {last_seq} is not the one the chain was sealed through");
            (last_seq, problem)
        })
    }
}
