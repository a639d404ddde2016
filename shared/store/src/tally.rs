//! What the request being served has done so far, counted as it runs, for its log record
//! (docs/design.md, "What an operator sees"): the statements it ran, the times it tried its
//! write, and how long it waited for a site's copy or for a turn of its org's share. A
//! component serves one request at a time on one thread, so the tally is the thread's.

use std::cell::RefCell;
use std::time::Duration;

/// The counts of one request.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Tally {
    pub statements: u32,
    pub write_attempts: u32,
    pub copy_wait: Duration,
    pub share_wait: Duration,
}

thread_local! {
    static TALLY: RefCell<Tally> = RefCell::new(Tally::default());
}

fn add(change: impl FnOnce(&mut Tally)) {
    TALLY.with(|tally| change(&mut tally.borrow_mut()));
}

pub fn statement_ran() {
    add(|t| t.statements += 1);
}

pub fn write_tried() {
    add(|t| t.write_attempts += 1);
}

pub fn waited_for_copy(waited: Duration) {
    add(|t| t.copy_wait += waited);
}

pub fn waited_for_share(waited: Duration) {
    add(|t| t.share_wait += waited);
}

/// The request's counts, the tally starting again from nothing.
pub fn take() -> Tally {
    TALLY.with(|tally| std::mem::take(&mut *tally.borrow_mut()))
}
