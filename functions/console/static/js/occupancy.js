// The occupancy of a node: what each unit is, from what the key may read.
//
// Plain functions over the API's JSON (a node, its reservations, its running VMs), no DOM,
// so the rules are in one place: the map, the node list's summaries and the legend all use
// them. The rules follow the service's own (docs/design.md, "Placement"):
//   - a unit of a `needs-review` reservation is withheld from everyone: needs-review;
//   - a unit running a VM is running (tier, org), whatever its reservation;
//   - a unit in the releasedUnitIds of an active reservation is on the spot market: released;
//   - a unit of an active or pending reservation is reserved (for its audience);
//   - anything else (no reservation, or only cancelled or expired ones) is free.
// A unit running a VM also remembers whether its capacity is released, since a spot VM on
// released capacity is exactly what a reclaim would terminate.

/** The states, in legend order. `label` is the text shown in every unit of that state. */
export const STATES = [
  { id: 'free', label: 'free', description: 'Free: no reservation, nothing running' },
  { id: 'reserved', label: 'reserved', description: 'Reserved for a reservation’s audience (active, or pending until its start)' },
  { id: 'released', label: 'spot market', description: 'Released: reserved capacity sold on the spot market (tier=spot only), reclaimable' },
  { id: 'running', label: 'VM', description: 'Running a VM (its tier and org are shown)' },
  { id: 'needs-review', label: 'review', description: 'Needs review: the node changed under the reservation; withheld from everyone' },
];

/** Reservation statuses that hold units. Cancelled and expired ones hold nothing. */
const HOLDING = ['needs-review', 'active', 'pending'];

/** A short tag per reservation (R1, R2… in the API's order, oldest first) for the map. */
export function reservationTags(reservations) {
  return new Map(reservations.map((r, i) => [r.id, `R${i + 1}`]));
}

/**
 * The state of every unit of `node`, in the node's order.
 * @param {{unitIds: string[]}} node
 * @param {Array} reservations the node's reservations the key may read (any status)
 * @param {Array} vms the running VMs on the node the key may read
 * @returns {Array<{id, state, label, tag, reservation, vm, released}>}
 */
export function occupancy(node, reservations, vms) {
  const tags = reservationTags(reservations);
  // The reservation that decides a unit: needs-review before active before pending.
  const holder = new Map();
  for (const status of HOLDING) {
    for (const reservation of reservations) {
      if (reservation.status !== status) continue;
      for (const unitId of reservation.reservedUnitIds || []) {
        if (!holder.has(unitId)) holder.set(unitId, reservation);
      }
    }
  }
  const vmOn = new Map();
  for (const vm of vms) {
    if (vm.status !== 'running') continue;
    for (const unitId of vm.unitIds) vmOn.set(unitId, vm);
  }
  return node.unitIds.map((id) => {
    const reservation = holder.get(id) || null;
    const vm = vmOn.get(id) || null;
    const released = Boolean(
      reservation && reservation.status === 'active' && (reservation.releasedUnitIds || []).includes(id),
    );
    let state;
    if (reservation && reservation.status === 'needs-review') state = 'needs-review';
    else if (vm) state = 'running';
    else if (released) state = 'released';
    else if (reservation) state = 'reserved';
    else state = 'free';
    const tag = reservation ? tags.get(reservation.id) : null;
    return { id, state, label: labelOf(state, vm), tag, reservation, vm, released };
  });
}

/** The text a unit shows: its state's label, and for a VM its tier. */
function labelOf(state, vm) {
  if (state === 'running' && vm) return `${vm.tier} VM`;
  return STATES.find((s) => s.id === state).label;
}

/** A one-line summary: units, reserved, released, running. */
export function summary(units) {
  const count = (predicate) => units.filter(predicate).length;
  return {
    units: units.length,
    reserved: count((u) => u.reservation !== null),
    released: count((u) => u.released),
    running: count((u) => u.vm !== null),
    review: count((u) => u.state === 'needs-review'),
  };
}

/** The summary as text. */
export function summaryText(s) {
  const parts = [`${s.units} units`, `${s.reserved} reserved`, `${s.released} released`, `${s.running} running`];
  if (s.review) parts.push(`${s.review} need review`);
  return parts.join(' · ');
}

/**
 * Whether the key may release and reclaim on `reservation`: it holds reservation.capacity and
 * is an operator, the node's owner org or one of the reservation's managing orgs, and the
 * reservation is active. The API decides in the end; this only keeps buttons that could
 * never work off the page.
 */
export function mayManage(whoami, node, reservation) {
  if (!whoami || !reservation || reservation.status !== 'active') return false;
  if (!whoami.permissions.includes('reservation.capacity')) return false;
  return whoami.operator || whoami.orgId === node.ownerOrgId || reservation.managingOrgIds.includes(whoami.orgId);
}
