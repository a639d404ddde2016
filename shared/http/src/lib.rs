//! The thin shell every component shares: the route table, serving a component's routes
//! from it, strict request parsing, authentication, idempotency, problem JSON and the API's
//! JSON representations. A component's handlers parse with this and name what the request
//! asks for, a [`Read`] or an [`Operation`]; the executor ([`execute`]) answers or carries
//! it out through the store (which asks the domain), and renders the answer.

pub mod auth;
pub mod bookmark;
pub mod cell_health;
pub mod config;
pub mod execute;
pub mod forward;
pub mod input;
pub mod operation;
pub mod problem;
pub mod read;
pub mod render;
pub mod request_log;
pub mod routes;

pub use input::{Answer, Call};
pub use operation::Operation;
pub use problem::Problem;
pub use read::Read;
pub use render::Reply;
pub use routes::Incoming;
pub use routes::serve;
