// The occupancy map: the legend and the grid of units.
//
// Each unit is an option of a multi-select listbox. Its state is in `data-state` (the CSS
// gives every state a colour *and* a pattern) and in its visible text label, so no state is
// told by hue alone. Keyboard: one tab stop for the whole grid (roving tabindex); arrow keys,
// Home and End move; Space or Enter toggles the unit's selection; Escape clears it.

import { el, append, replace } from './dom.js';
import { STATES } from './occupancy.js';

/** Draws the legend: one swatch (colour + pattern) and label per state. */
export function renderLegend(legend) {
  replace(
    legend,
    STATES.map((state) =>
      el(
        'li',
        { class: 'legend-item', 'data-legend': state.id },
        el('span', { class: 'swatch', 'data-state': state.id, 'aria-hidden': 'true' }),
        el('span', { class: 'legend-label', text: state.label }),
        el('span', { class: 'legend-description', text: ` — ${state.description}` }),
      ),
    ),
    el(
      'li',
      { class: 'legend-item' },
      el('span', { class: 'swatch', 'data-state': 'running', 'data-released': 'true', 'aria-hidden': 'true' }),
      el('span', { class: 'legend-label', text: 'VM on released' }),
      el('span', { class: 'legend-description', text: ' — a VM on capacity released to the spot market (corner mark)' }),
    ),
  );
}

/**
 * The grid of a node's units. `onFocus(unit)` is told which unit has the focus (to show its
 * details), `onSelect(selectedIds)` whenever the selection changes.
 */
export class UnitMap {
  constructor(container, { onFocus, onSelect }) {
    this.container = container;
    this.onFocus = onFocus;
    this.onSelect = onSelect;
    this.units = [];
    this.cells = [];
    this.selected = new Set();
    this.focusIndex = 0;
    container.setAttribute('role', 'listbox');
    container.addEventListener('keydown', (event) => this.keydown(event));
    container.addEventListener('click', (event) => {
      const cell = event.target.closest('[data-unit-id]');
      if (cell) this.activate(Number(cell.dataset.index));
    });
    container.addEventListener('focusin', (event) => {
      const cell = event.target.closest('[data-unit-id]');
      if (cell) this.moveTo(Number(cell.dataset.index), false);
    });
  }

  /** Draws `units` (from occupancy()), keeping the selection of units that still exist. */
  render(units, selectable) {
    this.units = units;
    this.selectable = selectable;
    const ids = new Set(units.map((u) => u.id));
    this.selected = new Set([...this.selected].filter((id) => ids.has(id)));
    this.focusIndex = Math.min(this.focusIndex, Math.max(units.length - 1, 0));
    this.cells = units.map((unit, index) => this.cell(unit, index));
    replace(this.container, this.cells);
    this.container.setAttribute('aria-multiselectable', selectable ? 'true' : 'false');
  }

  cell(unit, index) {
    const description = describe(unit);
    const cell = el(
      'div',
      {
        role: 'option',
        class: 'unit',
        id: `unit-${index}`,
        tabindex: index === this.focusIndex ? '0' : '-1',
        'data-index': index,
        'data-unit-id': unit.id,
        'data-state': unit.state,
        'data-tier': unit.vm ? unit.vm.tier : null,
        'data-released': unit.released ? 'true' : null,
        'aria-selected': this.selected.has(unit.id) ? 'true' : 'false',
        'aria-label': description,
        title: description,
      },
      el('span', { class: 'unit-id', text: unit.id }),
      el('span', { class: 'unit-label', text: unit.label }),
      unit.vm ? el('span', { class: 'unit-extra', text: unit.vm.orgId }) : null,
      unit.reservation && !unit.vm ? el('span', { class: 'unit-extra', text: reservationLine(unit.tag, unit.reservation) }) : null,
      unit.released && unit.state === 'running' ? el('span', { class: 'unit-extra', text: 'on released' }) : null,
    );
    return cell;
  }

  /** Marks the units of a dry run's VMs: 'terminate' or 'skip' (null clears every mark). */
  markPlan(plan) {
    for (const cell of this.cells) {
      cell.querySelector('.unit-plan')?.remove();
      const mark = plan ? plan.get(cell.dataset.unitId) : undefined;
      if (mark) {
        cell.setAttribute('data-plan', mark);
        append(cell, el('span', { class: 'unit-plan', text: mark === 'terminate' ? '✕ terminate' : '• stays' }));
      } else {
        cell.removeAttribute('data-plan');
      }
    }
  }

  clearSelection() {
    this.selected.clear();
    for (const cell of this.cells) cell.setAttribute('aria-selected', 'false');
    this.onSelect([...this.selected]);
  }

  /** Selects exactly `ids` (e.g. every released unit of a reservation). */
  select(ids) {
    this.selected = new Set(ids);
    for (const cell of this.cells) {
      cell.setAttribute('aria-selected', this.selected.has(cell.dataset.unitId) ? 'true' : 'false');
    }
    this.onSelect([...this.selected]);
  }

  /** Click, Space or Enter on a unit: focus it, and toggle it when units are selectable. */
  activate(index) {
    this.moveTo(index, true);
    if (!this.selectable) return;
    const cell = this.cells[index];
    const id = cell.dataset.unitId;
    if (this.selected.has(id)) this.selected.delete(id);
    else this.selected.add(id);
    cell.setAttribute('aria-selected', this.selected.has(id) ? 'true' : 'false');
    this.onSelect([...this.selected]);
  }

  moveTo(index, focus) {
    if (!this.cells.length) return;
    const target = Math.max(0, Math.min(index, this.cells.length - 1));
    if (this.cells[this.focusIndex]) this.cells[this.focusIndex].setAttribute('tabindex', '-1');
    this.focusIndex = target;
    const cell = this.cells[target];
    cell.setAttribute('tabindex', '0');
    if (focus && document.activeElement !== cell) cell.focus();
    this.onFocus(this.units[target]);
  }

  /** How many units one row of the grid holds, as laid out now. */
  columns() {
    if (this.cells.length < 2) return 1;
    const top = this.cells[0].offsetTop;
    const index = this.cells.findIndex((cell) => cell.offsetTop !== top);
    return index === -1 ? this.cells.length : index;
  }

  keydown(event) {
    const moves = {
      ArrowLeft: -1,
      ArrowRight: 1,
      ArrowUp: -this.columns(),
      ArrowDown: this.columns(),
    };
    if (event.key in moves) {
      this.moveTo(this.focusIndex + moves[event.key], true);
    } else if (event.key === 'Home') {
      this.moveTo(0, true);
    } else if (event.key === 'End') {
      this.moveTo(this.cells.length - 1, true);
    } else if (event.key === ' ' || event.key === 'Enter') {
      this.activate(this.focusIndex);
    } else if (event.key === 'Escape') {
      this.clearSelection();
    } else {
      return;
    }
    event.preventDefault();
  }
}

/** Which reservation holds a unit, and for whom: `R1 · for aud`, `R2 · pending`. */
function reservationLine(tag, reservation) {
  if (reservation.status !== 'active') return `${tag} · ${reservation.status}`;
  return `${tag} · for ${reservation.allowedOrgIds.join(', ') || 'no org'}`;
}

/** A unit in words, for screen readers and tooltips. */
export function describe(unit) {
  const parts = [`Unit ${unit.id}: ${unit.label}`];
  if (unit.vm) parts.push(`VM ${unit.vm.id} of org ${unit.vm.orgId}, tier ${unit.vm.tier}`);
  if (unit.released) parts.push('released to the spot market');
  if (unit.reservation) {
    parts.push(`reservation ${unit.tag} ${unit.reservation.id} (${unit.reservation.status}) for ${unit.reservation.allowedOrgIds.join(', ') || 'no org'}`);
  }
  return parts.join('; ');
}
