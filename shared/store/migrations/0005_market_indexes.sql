-- Schema 5: the spot market lists released units by node and unit from a cursor; a partial
-- index holds only released units, so a page walks only those (O(units listed)), and
-- another finds a node's needs-review reservations (rare) without scanning the others.

CREATE INDEX reservation_units_released ON reservation_units(node_id, unit_id) WHERE released = 1;

CREATE INDEX reservations_needs_review ON reservations(node_id) WHERE state = 'needs-review';
