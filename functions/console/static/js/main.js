// The console's entry point: the key form, the node list, the map and the actions.
//
// State lives in `view` below; every change of it goes through a function here that reads
// the API and redraws the parts that depend on it. The page shows exactly what the pasted
// key may see: a refusal of a read becomes an empty list with the reason, never a guess.

import { call, all, segment, storedKey, storeKey, forgetKey } from './api.js';
import { el, append, replace, byId } from './dom.js';
import { occupancy, summary, summaryText, mayManage } from './occupancy.js';
import { UnitMap, renderLegend } from './map.js';
import { renderDetails, renderReservations, renderProblem, renderPlan, renderTimeline } from './panels.js';

/** The most units the map draws (a larger node is shown in part, and says so). */
const MAX_UNITS = 4096;
/** Nodes per page of the node list. */
const NODE_PAGE = 100;

const view = {
  whoami: null,
  nodes: [],
  nodeCursor: null,
  node: null,
  reservations: [],
  vms: [],
  units: [],
  selected: [],
  /** The unit ids of the pending dry run, while it waits for confirmation. */
  planned: null,
  timelineFor: null,
};

const map = new UnitMap(byId('grid'), { onFocus: showUnit, onSelect: selectionChanged });

// ---------------------------------------------------------------- the key

async function connect() {
  clearNode();
  replace(byId('node-list'));
  const identity = byId('identity');
  byId('forget').hidden = !storedKey();
  if (!storedKey()) {
    view.whoami = null;
    identity.textContent = 'Paste an API key to see what it may see.';
    byId('nodes-status').textContent = '';
    return;
  }
  identity.textContent = 'Checking the key…';
  const who = await call('GET', '/v1/whoami');
  if (!who.ok) {
    view.whoami = null;
    identity.textContent = `The key was refused: ${who.problem.title}. ${who.problem.detail}`;
    byId('nodes-status').textContent = 'Nothing to show.';
    return;
  }
  view.whoami = who.body;
  let whose = 'an operator key (above all orgs)';
  if (!who.body.operator) {
    const org = await call('GET', `/v1/orgs/${segment(who.body.orgId)}`);
    whose = org.ok ? `org ${org.body.name} (${org.body.id})` : `org ${who.body.orgId}`;
  }
  replace(
    identity,
    'Key ',
    el('code', { text: who.body.keyId }),
    ` of ${whose}. May: ${who.body.permissions.join(', ') || 'nothing'}.`,
  );
  await loadNodes(null);
}

// ---------------------------------------------------------------- the node list

async function loadNodes(cursor) {
  const status = byId('nodes-status');
  status.textContent = 'Loading nodes…';
  const page = await call('GET', `/v1/nodes?limit=${NODE_PAGE}${cursor ? `&cursor=${encodeURIComponent(cursor)}` : ''}`);
  if (!page.ok) {
    status.textContent = `No nodes this key may see (${page.problem.title}).`;
    byId('more-nodes').hidden = true;
    return;
  }
  view.nodeCursor = page.body.nextCursor || null;
  byId('more-nodes').hidden = !view.nodeCursor;
  const list = byId('node-list');
  for (const node of page.body.items) {
    view.nodes.push(node);
    const line = el('span', { class: 'node-summary muted', text: `${node.unitCount} units…` });
    const button = el(
      'button',
      { type: 'button', class: 'node', 'data-node-id': node.id, 'aria-pressed': 'false' },
      el('span', { class: 'node-id', text: node.id }),
      line,
    );
    button.addEventListener('click', () => openNode(node.id));
    append(list, el('li', {}, button));
  }
  status.textContent = view.nodes.length ? '' : 'No nodes this key may see.';
  // One-line summaries, a few nodes at a time.
  const pending = page.body.items.map((n) => n.id);
  const worker = async () => {
    for (let id = pending.shift(); id !== undefined; id = pending.shift()) {
      const data = await loadNode(id);
      const line = list.querySelector(`[data-node-id="${CSS.escape(id)}"] .node-summary`);
      if (line) line.textContent = data.node ? summaryText(summary(data.units)) : 'not readable';
    }
  };
  await Promise.all([worker(), worker(), worker()]);
}

/** A node with its units, the reservations and running VMs the key may read. */
async function loadNode(id) {
  const [node, reservations, vms] = await Promise.all([
    call('GET', `/v1/nodes/${segment(id)}`),
    all(`/v1/nodes/${segment(id)}/reservations`),
    all(`/v1/vms?nodeId=${encodeURIComponent(id)}&status=running`, { pageSize: 500 }),
  ]);
  if (!node.ok) return { node: null, problem: node.problem, units: [] };
  const r = reservations.ok ? reservations.body.items : [];
  const v = vms.ok ? vms.body.items : [];
  return {
    node: node.body,
    reservations: r,
    vms: v,
    units: occupancy(node.body, r, v),
    notes: [
      reservations.ok ? null : `reservations not readable (${reservations.problem.title})`,
      vms.ok ? null : `VMs not readable (${vms.problem.title})`,
    ].filter(Boolean),
  };
}

// ---------------------------------------------------------------- one node

function clearNode() {
  view.node = null;
  view.units = [];
  view.planned = null;
  view.timelineFor = null;
  map.selected.clear();
  map.render([], false);
  byId('map-summary').textContent = 'Pick a node.';
  byId('refresh').hidden = true;
  byId('map-help').hidden = true;
  byId('actions').hidden = true;
  renderProblem(byId('problem'), null);
  renderDetails(byId('details'), null);
  replace(byId('reservation-list'));
  replace(byId('timeline'));
  byId('timeline-status').textContent = 'Select a reservation to see its audit trail.';
}

async function openNode(id) {
  for (const button of document.querySelectorAll('#node-list button.node')) {
    button.setAttribute('aria-pressed', button.dataset.nodeId === id ? 'true' : 'false');
  }
  if (!view.node || view.node.id !== id) {
    clearNode();
  }
  await refreshNode(id);
}

/** Reads the node again and redraws the map, keeping the selection. */
async function refreshNode(id) {
  const grid = byId('grid');
  grid.setAttribute('aria-busy', 'true');
  const data = await loadNode(id);
  grid.setAttribute('aria-busy', 'false');
  if (!data.node) {
    clearNode();
    byId('map-summary').textContent = `Node ${id} is not readable with this key (${data.problem.title}).`;
    return;
  }
  Object.assign(view, { node: data.node, reservations: data.reservations, vms: data.vms, units: data.units });
  const shown = data.units.slice(0, MAX_UNITS);
  map.render(shown, canAct());
  const line = `${data.node.id} (owner ${data.node.ownerOrgId}, topology ${data.node.topologyGen}): ${summaryText(summary(data.units))}`;
  const notes = [...data.notes];
  if (shown.length < data.units.length) notes.push(`showing the first ${shown.length} units`);
  byId('map-summary').textContent = notes.length ? `${line}. ${notes.join('; ')}.` : line;
  const nodeLine = document.querySelector(`#node-list [data-node-id="${CSS.escape(id)}"] .node-summary`);
  if (nodeLine) nodeLine.textContent = summaryText(summary(data.units));
  byId('refresh').hidden = false;
  byId('map-help').hidden = false;
  const pick = view.reservations.find((r) => r.id === view.timelineFor) ||
    view.reservations.find((r) => r.status === 'active') || view.reservations[0];
  renderReservations(byId('reservation-list'), view.reservations, showTimeline, pick && pick.id);
  if (pick) await showTimeline(pick);
  selectionChanged(map.selected ? [...map.selected] : []);
}

/**
 * Whether the key could act on this node at all: it holds reservation.capacity and is an
 * operator, the node's owner org or a managing org of one of its reservations (the API
 * decides per reservation; this keeps controls that could never work off the page).
 */
function canAct() {
  const who = view.whoami;
  if (!who || !view.node || !who.permissions.includes('reservation.capacity')) return false;
  return who.operator || who.orgId === view.node.ownerOrgId ||
    view.reservations.some((r) => r.managingOrgIds.includes(who.orgId));
}

function showUnit(unit) {
  renderDetails(byId('details'), unit);
  if (unit && unit.reservation && unit.reservation.id !== view.timelineFor) showTimeline(unit.reservation);
}

// ---------------------------------------------------------------- the audit trail

async function showTimeline(reservation) {
  view.timelineFor = reservation.id;
  for (const button of document.querySelectorAll('#reservation-list button.reservation')) {
    button.setAttribute('aria-pressed', button.dataset.reservationId === reservation.id ? 'true' : 'false');
  }
  const status = byId('timeline-status');
  status.textContent = `Loading the audit trail of ${reservation.id}…`;
  const events = await all(`/v1/audit?reservationId=${encodeURIComponent(reservation.id)}`, { max: 2000, pageSize: 1000 });
  if (view.timelineFor !== reservation.id) return;
  if (!events.ok) {
    replace(byId('timeline'));
    status.textContent = `The audit trail of ${reservation.id} is not readable with this key (${events.problem.title}).`;
    return;
  }
  status.textContent = `Reservation ${reservation.id}: ${events.body.items.length} event(s), oldest first.`;
  renderTimeline(byId('timeline'), events.body.items);
}

// ---------------------------------------------------------------- acting on a selection

/** The reservation all selected units belong to, or why there is none. */
function selectionTarget(ids) {
  if (!ids.length) return { why: 'Select units of one reservation (click, or Space on a unit) to release or reclaim them.' };
  const units = view.units.filter((u) => ids.includes(u.id));
  const reservations = new Set(units.map((u) => (u.reservation ? u.reservation.id : null)));
  if (reservations.has(null)) return { why: 'Some selected units belong to no reservation this key may see.' };
  if (reservations.size > 1) return { why: 'The selection spans several reservations: select units of one.' };
  const reservation = units[0].reservation;
  if (!mayManage(view.whoami, view.node, reservation)) {
    return { why: `This key may not release or reclaim on reservation ${reservation.id} (${reservation.status}).` };
  }
  return { reservation };
}

function selectionChanged(ids) {
  view.selected = ids;
  const panel = byId('actions');
  panel.hidden = !canAct() || !view.node;
  if (panel.hidden) return;
  if (view.planned && ids.join() !== view.planned.join()) cancelPlan();
  const target = selectionTarget(ids);
  const text = byId('selection-text');
  if (target.why) {
    text.textContent = ids.length ? `${ids.length} unit(s) selected. ${target.why}` : target.why;
  } else {
    text.textContent = `${ids.length} unit(s) of reservation ${target.reservation.id} selected: ${ids.join(', ')}.`;
  }
  byId('action-controls').hidden = Boolean(target.why);
}

function capacityPath(reservation, action) {
  return `/v1/nodes/${segment(view.node.id)}/reservations/${segment(reservation.id)}/${action}`;
}

function requestBody(ids) {
  const reason = byId('reason').value.trim();
  return reason ? { unitIds: ids, reason } : { unitIds: ids };
}

function setBusy(busy) {
  for (const id of ['release', 'reclaim', 'confirm-reclaim']) byId(id).disabled = busy;
}

async function release() {
  const { reservation } = selectionTarget(view.selected);
  if (!reservation) return;
  if (!byId('reason').value.trim()) {
    byId('outcome').textContent = 'Give a reason for the release: it is recorded in the audit trail.';
    byId('reason').focus();
    return;
  }
  setBusy(true);
  const ids = [...view.selected];
  const answer = await call('POST', capacityPath(reservation, 'release'), requestBody(ids));
  setBusy(false);
  if (!answer.ok) {
    showRefusal(answer.problem, 'Release');
    return;
  }
  renderProblem(byId('problem'), null);
  byId('outcome').textContent = `Released ${ids.length} unit(s) of ${reservation.id} to the spot market: ${ids.join(', ')}.`;
  map.clearSelection();
  await refreshNode(view.node.id);
}

/** Reclaim, step one: the dry run, shown on the map; the reclaim waits for confirmation. */
async function reclaimDryRun() {
  const { reservation } = selectionTarget(view.selected);
  if (!reservation) return;
  setBusy(true);
  const ids = [...view.selected];
  const answer = await call('POST', capacityPath(reservation, 'reclaim/dry-run'), requestBody(ids));
  setBusy(false);
  if (!answer.ok) {
    showRefusal(answer.problem, 'Dry run');
    return;
  }
  renderProblem(byId('problem'), null);
  const vmsById = new Map(view.vms.map((vm) => [vm.id, vm]));
  const plan = new Map();
  for (const [list, verdict] of [[answer.body.wouldTerminate, 'terminate'], [answer.body.wouldSkip, 'skip']]) {
    for (const id of list) {
      for (const unitId of vmsById.get(id)?.unitIds || []) plan.set(unitId, verdict);
    }
  }
  map.markPlan(plan);
  renderPlan(byId('plan-body'), answer.body, vmsById);
  view.planned = ids;
  byId('plan').hidden = false;
  byId('reclaim').disabled = true;
  byId('release').disabled = true;
  byId('outcome').textContent = 'Dry run done: nothing changed yet. Confirm to reclaim.';
  byId('confirm-reclaim').focus();
}

/** Reclaim, step two: the real reclaim of exactly the units of the dry run. */
async function confirmReclaim() {
  const { reservation } = selectionTarget(view.planned || []);
  if (!reservation) return;
  setBusy(true);
  const ids = view.planned;
  const answer = await call('POST', capacityPath(reservation, 'reclaim'), requestBody(ids));
  setBusy(false);
  cancelPlan();
  if (!answer.ok) {
    showRefusal(answer.problem, 'Reclaim');
    return;
  }
  renderProblem(byId('problem'), null);
  byId('outcome').textContent = `Reclaimed ${ids.length} unit(s) of ${reservation.id}; terminated: ${answer.body.terminated.join(', ') || 'none'}; left running: ${answer.body.skipped.join(', ') || 'none'}.`;
  map.clearSelection();
  await refreshNode(view.node.id);
}

function cancelPlan() {
  view.planned = null;
  map.markPlan(null);
  byId('plan').hidden = true;
  replace(byId('plan-body'));
  byId('reclaim').disabled = false;
  byId('release').disabled = false;
}

function showRefusal(problem, what) {
  byId('outcome').textContent = '';
  renderProblem(byId('problem'), problem, what);
  // Point at the offending units on the map too.
  const offending = new Set(problem.unitIds || []);
  for (const cell of document.querySelectorAll('#grid [data-unit-id]')) {
    if (offending.has(cell.dataset.unitId)) cell.setAttribute('data-offending', 'true');
    else cell.removeAttribute('data-offending');
  }
}

// ---------------------------------------------------------------- wiring

renderLegend(byId('legend'));
byId('key-form').addEventListener('submit', (event) => {
  event.preventDefault();
  const input = byId('api-key');
  const key = input.value.trim();
  input.value = '';
  if (key) storeKey(key);
  view.nodes = [];
  connect();
});
byId('forget').addEventListener('click', () => {
  forgetKey();
  view.nodes = [];
  connect();
});
byId('more-nodes').addEventListener('click', () => loadNodes(view.nodeCursor));
byId('refresh').addEventListener('click', () => view.node && refreshNode(view.node.id));
byId('release').addEventListener('click', release);
byId('reclaim').addEventListener('click', reclaimDryRun);
byId('confirm-reclaim').addEventListener('click', confirmReclaim);
byId('cancel-reclaim').addEventListener('click', () => {
  cancelPlan();
  byId('outcome').textContent = 'Reclaim cancelled: nothing changed.';
  byId('reclaim').focus();
});
byId('clear-selection').addEventListener('click', () => map.clearSelection());
connect();
