//! End-to-end suites: the real components, built for wasm32-wasip2, served by the project's
//! host over real HTTP, against real SQLite files. One test binary, one module per concern.

mod audit;
mod authz_sweep;
mod capacity;
mod cells;
mod concurrency;
mod costs;
mod crash;
mod damaged_rows;
mod demo;
mod errors;
mod faults;
mod feed;
mod hostile;
mod idempotency;
mod identity;
mod isolation;
mod market;
mod nodes;
mod notice;
mod openapi;
mod replicas;
mod reservations;
mod routes;
mod security;
mod sites;
mod smoke;
mod telemetry;
mod vms;
mod watchdog;
