//! The thin shell every component shares: the route table, serving a component's routes
//! from it, strict request parsing, authentication, idempotency, problem JSON and the API's
//! JSON representations. Components parse with this, call the store (which asks the
//! domain), and render.

pub mod auth;
pub mod bookmark;
pub mod cell_health;
pub mod config;
pub mod dispatch;
pub mod execute;
pub mod forward;
mod idempotency;
pub mod incoming;
pub mod input;
pub mod operation;
pub mod problem;
pub mod render;
pub mod request_log;
pub mod response;
pub mod routes;
pub mod spin_store;

pub use dispatch::serve;
pub use incoming::Incoming;
pub use input::{Answer, Call};
pub use operation::Operation;
pub use problem::Problem;
pub use response::Reply;
