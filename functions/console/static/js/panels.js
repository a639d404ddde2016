// The side panels: a unit's details, the node's reservations, a refusal, a dry run's plan
// and a reservation's audit trail. Each function renders API data into one container with
// the escaping helpers of dom.js, never by parsing strings as HTML.

import { el, append, replace, facts, time } from './dom.js';
import { reservationTags } from './occupancy.js';

const list = (ids) => (ids && ids.length ? ids.join(', ') : '—');

/** A unit's reservation and VM. */
export function renderDetails(container, unit) {
  if (!unit) {
    replace(container, el('p', { class: 'muted', text: 'Select a unit to see its reservation and VM.' }));
    return;
  }
  const parts = [
    el('p', {}, el('strong', { text: unit.id }), ` — ${unit.label}${unit.released && unit.state === 'running' ? ' (on released capacity)' : ''}`),
  ];
  if (unit.vm) {
    const vm = unit.vm;
    parts.push(
      el('h3', { text: 'VM' }),
      facts([
        ['id', vm.id],
        ['org', vm.orgId],
        ['tier', vm.tier],
        ['units', list(vm.unitIds)],
        ['since', time(vm.createdAt)],
      ]),
    );
  } else {
    parts.push(el('p', { class: 'muted', text: 'No running VM this key may see.' }));
  }
  if (unit.reservation) parts.push(el('h3', { text: `Reservation ${unit.tag}` }), reservationFacts(unit.reservation));
  else parts.push(el('p', { class: 'muted', text: 'No reservation this key may see.' }));
  replace(container, parts);
}

function reservationFacts(r) {
  return facts([
    ['id', r.id],
    ['status', r.status],
    ['audience', list(r.allowedOrgIds)],
    ['managed by', list(r.managingOrgIds)],
    ['term', append(el('span'), time(r.startsAt), ' → ', r.endsAt ? time(r.endsAt) : 'open-ended')],
    ['released until', (r.releasedUnitIds || []).length ? (r.endsAt ? time(r.endsAt) : 'reclaimed (no end)') : ''],
    ['units', `${(r.reservedUnitIds || []).length} reserved, ${(r.releasedUnitIds || []).length} released`],
    ['contract', r.contractRef],
    ['reason', r.reason],
  ]);
}

/** The node's reservations; `onPick(reservation)` shows one's audit trail. */
export function renderReservations(container, reservations, onPick, selectedId) {
  if (!reservations.length) {
    replace(container, el('li', { class: 'muted', text: 'None this key may see.' }));
    return;
  }
  const tags = reservationTags(reservations);
  replace(
    container,
    reservations.map((r) => {
      const button = el(
        'button',
        { type: 'button', class: 'reservation', 'data-reservation-id': r.id, 'aria-pressed': r.id === selectedId ? 'true' : 'false' },
        el('span', { class: 'reservation-id', text: `${tags.get(r.id)} · ${r.id}` }),
        el('span', { class: 'status', 'data-status': r.status, text: r.status }),
        el('span', { class: 'muted', text: `${(r.reservedUnitIds || []).length} units for ${list(r.allowedOrgIds)}` }),
      );
      button.addEventListener('click', () => onPick(r));
      return el('li', {}, button);
    }),
  );
}

/** A refusal: the problem's title, detail, code and the offending unit ids. */
export function renderProblem(container, problem, what) {
  if (!problem) {
    container.hidden = true;
    replace(container);
    return;
  }
  const parts = [
    el('h2', { text: `${what} refused: ${problem.title}` }),
    el('p', { class: 'problem-detail', text: problem.detail }),
  ];
  const pairs = [['code', problem.code], ['status', problem.status ? String(problem.status) : '']];
  if (problem.unitIds && problem.unitIds.length) {
    pairs.push(['units', el('span', { class: 'problem-units', text: problem.unitIds.join(', ') })]);
  }
  if (Array.isArray(problem.refusals) && problem.refusals.length) {
    pairs.push(['refusals', problem.refusals.map((r) => (typeof r === 'string' ? r : JSON.stringify(r))).join('; ')]);
  }
  if (problem.reservationStatus) pairs.push(['reservation status', problem.reservationStatus]);
  pairs.push(['request', problem.requestId]);
  parts.push(facts(pairs));
  replace(container, parts);
  container.hidden = false;
}

/** What a dry run says a reclaim would do, VM by VM with their units. */
export function renderPlan(container, result, vmsById) {
  const row = (id, verdict) => {
    const vm = vmsById.get(id);
    const detail = vm ? ` (${vm.tier}, org ${vm.orgId}, units ${vm.unitIds.join(', ')})` : '';
    return el('li', { 'data-vm-id': id, 'data-verdict': verdict }, el('strong', { text: id }), detail);
  };
  replace(
    container,
    el('p', { text: `Would terminate ${result.wouldTerminate.length} VM(s), leave ${result.wouldSkip.length} running.` }),
    result.wouldTerminate.length ? el('h4', { text: 'Terminated (spot)' }) : null,
    result.wouldTerminate.length ? el('ul', { class: 'plan-terminate' }, result.wouldTerminate.map((id) => row(id, 'terminate'))) : null,
    result.wouldSkip.length ? el('h4', { text: 'Left running (not spot)' }) : null,
    result.wouldSkip.length ? el('ul', { class: 'plan-skip' }, result.wouldSkip.map((id) => row(id, 'skip'))) : null,
  );
}

/** A reservation's audit trail, oldest first, as a timeline. */
export function renderTimeline(container, events) {
  replace(
    container,
    events.map((e) =>
      el(
        'li',
        { class: 'event', 'data-action': e.action },
        el('div', { class: 'event-head' }, el('strong', { class: 'event-action', text: e.action }), ' ', time(e.at)),
        facts([
          ['by', `${e.actorKeyId}${e.actorOrgId ? ` (org ${e.actorOrgId})` : ''}`],
          ['units', e.unitIds.length ? e.unitIds.join(', ') : ''],
          ['terminated', e.terminated.length ? e.terminated.join(', ') : ''],
          ['skipped', e.skipped.length ? e.skipped.join(', ') : ''],
          ['reason', e.reason],
        ]),
      ),
    ),
  );
}
