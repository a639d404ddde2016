-- Schema 1: the whole model.

CREATE TABLE orgs (
    id TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    created_at INTEGER NOT NULL
);

CREATE TABLE api_keys (
    id TEXT PRIMARY KEY,
    org_id TEXT NOT NULL REFERENCES orgs(id),
    name TEXT NOT NULL,
    role TEXT NOT NULL,
    permissions TEXT,
    secret_hash TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    created_by TEXT NOT NULL,
    revoked_at INTEGER
);

CREATE INDEX api_keys_by_org ON api_keys(org_id, created_at, id);

CREATE TABLE nodes (
    id TEXT PRIMARY KEY,
    owner_org_id TEXT NOT NULL REFERENCES orgs(id),
    topology_gen INTEGER NOT NULL,
    unit_count INTEGER NOT NULL,
    created_at INTEGER NOT NULL,
    updated_at INTEGER NOT NULL
);

CREATE INDEX nodes_by_owner ON nodes(owner_org_id);

CREATE TABLE node_units (
    node_id TEXT NOT NULL REFERENCES nodes(id),
    unit_id TEXT NOT NULL,
    position INTEGER NOT NULL,
    PRIMARY KEY (node_id, unit_id)
) WITHOUT ROWID;

CREATE TABLE reservations (
    id TEXT PRIMARY KEY,
    node_id TEXT NOT NULL REFERENCES nodes(id),
    state TEXT NOT NULL CHECK (state IN ('live', 'cancelled', 'needs-review')),
    starts_at INTEGER NOT NULL,
    ends_at INTEGER,
    allowed_org_ids TEXT NOT NULL,
    managing_org_ids TEXT NOT NULL,
    contract_ref TEXT,
    reason TEXT,
    topology_gen INTEGER NOT NULL,
    created_at INTEGER NOT NULL,
    updated_at INTEGER NOT NULL,
    CHECK (ends_at IS NULL OR ends_at > starts_at)
);

CREATE INDEX reservations_by_node ON reservations(node_id, created_at, id);

CREATE TABLE reservation_units (
    reservation_id TEXT NOT NULL REFERENCES reservations(id),
    position INTEGER NOT NULL,
    node_id TEXT NOT NULL,
    unit_id TEXT NOT NULL,
    released INTEGER NOT NULL DEFAULT 0 CHECK (released IN (0, 1)),
    PRIMARY KEY (reservation_id, unit_id)
) WITHOUT ROWID;

CREATE INDEX reservation_units_by_position ON reservation_units(reservation_id, position);

CREATE INDEX reservation_units_by_unit ON reservation_units(node_id, unit_id);

CREATE TABLE vms (
    id TEXT PRIMARY KEY,
    org_id TEXT NOT NULL REFERENCES orgs(id),
    node_id TEXT NOT NULL REFERENCES nodes(id),
    tier TEXT NOT NULL CHECK (tier IN ('spot', 'community', 'verified')),
    status TEXT NOT NULL CHECK (status IN ('running', 'terminated')),
    termination_reason TEXT,
    created_at INTEGER NOT NULL,
    terminated_at INTEGER
);

CREATE INDEX vms_by_org ON vms(org_id, created_at, id);

CREATE INDEX vms_by_node ON vms(node_id, created_at, id);

CREATE TABLE vm_units (
    vm_id TEXT NOT NULL REFERENCES vms(id),
    position INTEGER NOT NULL,
    node_id TEXT NOT NULL,
    unit_id TEXT NOT NULL,
    tier TEXT NOT NULL,
    running INTEGER NOT NULL CHECK (running IN (0, 1)),
    placed_at INTEGER NOT NULL,
    PRIMARY KEY (vm_id, unit_id)
) WITHOUT ROWID;

CREATE UNIQUE INDEX one_running_vm_per_unit ON vm_units(node_id, unit_id) WHERE running = 1;

CREATE TABLE audit_events (
    seq INTEGER PRIMARY KEY,
    id TEXT NOT NULL UNIQUE,
    at INTEGER NOT NULL,
    actor_key_id TEXT NOT NULL,
    actor_org_id TEXT,
    action TEXT NOT NULL,
    node_id TEXT,
    reservation_id TEXT,
    vm_id TEXT,
    org_id TEXT,
    subject_id TEXT,
    unit_ids TEXT NOT NULL,
    terminated TEXT NOT NULL,
    skipped TEXT NOT NULL,
    reason TEXT,
    request_id TEXT NOT NULL,
    visible_to TEXT NOT NULL,
    prev_hash TEXT NOT NULL,
    hash TEXT NOT NULL
);

CREATE INDEX audit_by_node ON audit_events(node_id, seq);

CREATE INDEX audit_by_reservation ON audit_events(reservation_id, seq);

CREATE INDEX audit_by_action ON audit_events(action, seq);

CREATE INDEX audit_by_time ON audit_events(at, seq);
