//! A reservation's status as a caller sees it: a module of its own, so that the refusals
//! (`error`) and the placement rules can name it without depending on the reservation rules.

use serde::{Deserialize, Serialize};

/// The status a caller sees.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Status {
    Pending,
    Active,
    Expired,
    Cancelled,
    NeedsReview,
}

impl Status {
    pub const ALL: [Status; 5] = [
        Status::Pending,
        Status::Active,
        Status::Expired,
        Status::Cancelled,
        Status::NeedsReview,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Status::Pending => "pending",
            Status::Active => "active",
            Status::Expired => "expired",
            Status::Cancelled => "cancelled",
            Status::NeedsReview => "needs-review",
        }
    }

    pub fn parse(s: &str) -> Option<Status> {
        Status::ALL.into_iter().find(|status| status.as_str() == s)
    }
}
