//! A database connection that fails on purpose, the way libSQL and a network fail, for the
//! store's retry paths: errors arrive as message text, as they do through Spin's `io(string)`.

// Each suite that includes these faults uses a part of them.
#![allow(dead_code)]

use std::cell::{Cell, RefCell};
use std::path::Path;

use reservations_store::native::NativeDb;
use reservations_store::{Sql, SqlRows, SqlValue, StorageError};

enum Fault {
    /// The next statement starting with `prefix` fails without running.
    Next { prefix: String, message: String },
    /// The next statement starting with `prefix` runs, and its answer is lost: the caller
    /// hears `message`, as when a connection drops after the primary committed.
    AnswerLost { prefix: String, message: String },
    /// Another writer appends to `chain` just before the next statement starting with
    /// `prefix` (`times` times): the plan that statement writes was made on facts that moved.
    /// Another writer's statement, committed just before the request's own.
    Meanwhile {
        prefix: String,
        statement: String,
        times: usize,
    },
}

pub struct Faulty {
    db: NativeDb,
    faults: RefCell<Vec<Fault>>,
    always: RefCell<Option<String>>,
    /// What every statement fails with once the next fault has fired.
    always_after_next_fault: RefCell<Option<String>>,
    injected: Cell<usize>,
}

impl Faulty {
    pub fn open(path: impl AsRef<Path>) -> Faulty {
        Faulty {
            db: NativeDb::open(path).unwrap(),
            faults: RefCell::new(Vec::new()),
            always: RefCell::new(None),
            always_after_next_fault: RefCell::new(None),
            injected: Cell::new(0),
        }
    }

    pub fn fail_next(&self, prefix: &str, message: &str) {
        self.faults.borrow_mut().push(Fault::Next {
            prefix: prefix.into(),
            message: message.into(),
        });
    }

    pub fn lose_answer_of_next(&self, prefix: &str, message: &str) {
        self.faults.borrow_mut().push(Fault::AnswerLost {
            prefix: prefix.into(),
            message: message.into(),
        });
    }

    /// Another writer changes `fact` (as the schema's triggers name it, e.g.
    /// `["org","acme"]`) just before each of the next `times` statements starting with
    /// `prefix`.
    pub fn move_fact_before(&self, prefix: &str, fact: &str, times: usize) {
        self.meanwhile(
            prefix,
            &format!(
                "INSERT INTO fact_versions (fact, version) VALUES ('{fact}', 1) \
                 ON CONFLICT (fact) DO UPDATE SET version = version + 1"
            ),
            times,
        );
    }

    /// Another writer appends an event to `chain` just before each of the next `times`
    /// statements starting with `prefix`.
    pub fn append_to_chain_before(&self, prefix: &str, chain: &str, times: usize) {
        self.meanwhile(
            prefix,
            &format!(
                "INSERT INTO audit_events (id, at, actor_key_id, action, unit_ids, terminated, \
                 skipped, request_id, visible_to, prev_hash, hash, hash_version, chain, chain_seq) \
                 SELECT 'evt-other-' || (SELECT count(*) FROM audit_events), 0, 'other', \
                   'org.create', '[]', '[]', '[]', 'req-other', '[]', \
                   COALESCE(MAX(hash), ''), 'h', 4, '{chain}', COALESCE(MAX(chain_seq), 0) + 1 \
                 FROM audit_events WHERE chain = '{chain}'"
            ),
            times,
        );
    }

    /// Another writer runs `statement` just before each of the next `times` statements
    /// starting with `prefix`.
    pub fn meanwhile(&self, prefix: &str, statement: &str, times: usize) {
        self.faults.borrow_mut().push(Fault::Meanwhile {
            prefix: prefix.into(),
            statement: statement.into(),
            times,
        });
    }

    pub fn fail_always(&self, message: &str) {
        *self.always.borrow_mut() = Some(message.into());
    }

    /// Every statement fails with `message` once the next fault set up has fired (e.g. an
    /// answer lost, and the store out of reach from then on).
    pub fn fail_always_after_next_fault(&self, message: &str) {
        *self.always_after_next_fault.borrow_mut() = Some(message.into());
    }

    pub fn heal(&self) {
        *self.always.borrow_mut() = None;
    }

    /// How many statements failed on purpose.
    pub fn injected(&self) -> usize {
        self.injected.get()
    }

    pub fn count(&self, table: &str) -> i64 {
        self.db
            .connection()
            .query_row(&format!("SELECT count(*) FROM {table}"), [], |r| r.get(0))
            .unwrap()
    }

    fn fail(&self, message: &str) -> Result<SqlRows, StorageError> {
        self.injected.set(self.injected.get() + 1);
        Err(StorageError::from_sqlite_message(message.to_owned()))
    }
}

impl Fault {
    fn prefix(&self) -> &str {
        match self {
            Fault::Next { prefix, .. }
            | Fault::AnswerLost { prefix, .. }
            | Fault::Meanwhile { prefix, .. } => prefix,
        }
    }
}

/// A fault set up and never hit means the path it was to test never ran: the test fails,
/// rather than passing without having tested anything.
impl Drop for Faulty {
    fn drop(&mut self) {
        if std::thread::panicking() {
            return;
        }
        let pending: Vec<String> = self
            .faults
            .borrow()
            .iter()
            .map(|fault| fault.prefix().to_owned())
            .collect();
        assert!(
            pending.is_empty(),
            "faults set up but never hit, before statements starting {pending:?}"
        );
    }
}

impl Sql for Faulty {
    fn execute(&self, statement: &str, params: &[SqlValue]) -> Result<SqlRows, StorageError> {
        if let Some(message) = self.always.borrow().clone() {
            return self.fail(&message);
        }
        let position = self
            .faults
            .borrow()
            .iter()
            .position(|fault| statement.trim_start().starts_with(fault.prefix()));
        if let Some(position) = position {
            let fault = self.faults.borrow_mut().remove(position);
            if let Some(message) = self.always_after_next_fault.borrow_mut().take() {
                *self.always.borrow_mut() = Some(message);
            }
            match fault {
                Fault::Next { message, .. } => return self.fail(&message),
                Fault::AnswerLost { message, .. } => {
                    self.db.execute(statement, params)?;
                    return self.fail(&message);
                }
                Fault::Meanwhile {
                    prefix,
                    statement: other,
                    times,
                } => {
                    self.injected.set(self.injected.get() + 1);
                    self.db.connection().execute(&other, []).unwrap();
                    if times > 1 {
                        self.meanwhile(&prefix, &other, times - 1);
                    }
                }
            }
        }
        self.db.execute(statement, params)
    }
}
