// Building DOM nodes safely.
//
// Everything the console shows from the API (org names, reasons, ids) goes through these
// helpers, which only ever set text with `textContent` and attributes with `setAttribute`.
// Nothing here parses a string as HTML, so markup in a name is shown as the characters it is.

/**
 * Creates an element.
 * @param {string} tag
 * @param {Object<string, string|boolean|number|null|undefined>} [attributes] set with
 *   setAttribute; `true` sets an empty attribute, false/null/undefined leave it out.
 *   `class` is the class list, `text` the element's textContent.
 * @param {...(Node|string|null|undefined)} children strings become text nodes.
 */
export function el(tag, attributes = {}, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attributes)) {
    if (value === false || value === null || value === undefined) continue;
    if (name === 'text') {
      node.textContent = String(value);
    } else {
      node.setAttribute(name, value === true ? '' : String(value));
    }
  }
  append(node, ...children);
  return node;
}

/** Appends children; strings become text nodes, null/undefined are skipped. */
export function append(parent, ...children) {
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue;
    parent.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return parent;
}

/** Replaces every child of `parent`. */
export function replace(parent, ...children) {
  parent.replaceChildren();
  return append(parent, ...children);
}

/** The element with this id (the page's fixed skeleton). */
export function byId(id) {
  const node = document.getElementById(id);
  if (!node) throw new Error(`the page has no #${id}`);
  return node;
}

/** A definition list from [term, description] pairs; descriptions may be nodes or text. */
export function facts(pairs) {
  const list = el('dl', { class: 'facts' });
  for (const [term, description] of pairs) {
    if (description === undefined || description === null || description === '') continue;
    append(list, el('dt', { text: term }), el('dd', {}, description));
  }
  return list;
}

/** A short local rendering of an RFC 3339 time, with the exact time as a tooltip. */
export function time(iso) {
  if (!iso) return '';
  const date = new Date(iso);
  const shown = Number.isNaN(date.getTime()) ? iso : date.toLocaleString();
  return el('time', { datetime: iso, title: iso, text: shown });
}
