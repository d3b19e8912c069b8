// Which arrows of the docs' Mermaid flowcharts run through a box they do not join.
//
//     node docs/check_diagrams.mjs docs/pages/index.md [more.md ...]
//
// Each ```mermaid flowchart of the pages is read with Mermaid's own parser (docs/node_modules, as
// `make docs` installs it) and laid out with dagre, as Mermaid lays it out (same rank and node
// spacing, its init directive's rankSpacing, each node's size estimated from its text). Prints one
// line per arrow that passes through another node's box and exits 1 if there is any; 0 and
// "no arrow crosses a box" otherwise. The sizes are estimates, so a route that only grazes a box
// may differ from a browser's; the estimate errs on the wide side.
// Used by tests/unit/test_docs_diagrams.py.
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const modules = path.join(path.dirname(fileURLToPath(import.meta.url)), 'node_modules');
// Mermaid sanitizes labels with DOMPurify, which needs a browser's DOM; the labels are only read here.
const { default: purify } = await import(path.join(modules, 'dompurify/dist/purify.es.mjs'));
Object.assign(purify, { addHook() {}, removeHook() {}, removeHooks() {}, removeAllHooks() {}, sanitize: (s) => s });
const { default: mermaid } = await import(path.join(modules, 'mermaid/dist/mermaid.core.mjs'));
const { layout } = await import(path.join(modules, 'dagre-d3-es/src/dagre/index.js'));
const { Graph } = await import(path.join(modules, 'dagre-d3-es/src/graphlib/index.js'));

const CHAR_PX = 10;   // 16 px text is 8-9 px a character: wider is the safe side
const PAD_PX = 30;    // Mermaid's flowchart padding, both sides
const LINE_PX = 24;

function size(text) {
  const lines = String(text).split(/<br\s*\/?>/);
  return { width: Math.max(...lines.map((l) => l.length)) * CHAR_PX + PAD_PX, height: lines.length * LINE_PX + LINE_PX };
}

async function crossings(source) {
  const { config } = await mermaid.parse(source);
  const diagram = await mermaid.mermaidAPI.getDiagramFromText(source);
  const db = diagram.db;
  const flow = config?.flowchart ?? {};
  const g = new Graph({ multigraph: true, compound: true });
  g.setGraph({ rankdir: db.getDirection?.() ?? 'TB', nodesep: flow.nodeSpacing ?? 50, ranksep: flow.rankSpacing ?? 50, marginx: 8, marginy: 8 });
  g.setDefaultEdgeLabel(() => ({}));
  const boxes = [...db.getVertices().values()];
  for (const v of boxes) g.setNode(v.id, size(v.text ?? v.id));
  for (const sub of db.getSubGraphs()) {
    g.setNode(sub.id, {});
    for (const n of sub.nodes) if (g.hasNode(n) && !g.parent(n)) g.setParent(n, sub.id);
  }
  db.getEdges().forEach((e, i) => {
    const label = e.text ? { width: e.text.length * CHAR_PX, height: LINE_PX, labelpos: 'c' } : {};
    g.setEdge(e.start, e.end, { ...label, minlen: e.length ?? 1 }, `e${i}`);
  });
  layout(g);
  const found = [];
  const inside = (p, n) => Math.abs(p.x - n.x) < n.width / 2 - 1 && Math.abs(p.y - n.y) < n.height / 2 - 1;
  for (const e of g.edges()) {
    const points = g.edge(e).points;
    for (const v of boxes) {
      if (v.id === e.v || v.id === e.w) continue;
      const n = g.node(v.id);
      const hit = points.slice(1).some((b, i) => {
        const a = points[i];
        for (let t = 0; t <= 1; t += 0.01) if (inside({ x: a.x + (b.x - a.x) * t, y: a.y + (b.y - a.y) * t }, n)) return true;
        return false;
      });
      if (hit) found.push(`${e.v} -> ${e.w} runs through ${v.id}`);
    }
  }
  return found;
}

let bad = 0;
for (const file of process.argv.slice(2)) {
  const text = fs.readFileSync(file, 'utf8');
  for (const m of text.matchAll(/```mermaid\n([\s\S]*?)```/g)) {
    const body = m[1];
    if (!/^\s*(%%.*\n\s*)*(flowchart|graph)\b/.test(body)) continue;
    const line = text.slice(0, m.index).split('\n').length;
    for (const c of await crossings(body)) {
      console.log(`${file}:${line}: ${c}`);
      bad++;
    }
  }
}
console.log(bad ? `${bad} arrows cross a box` : 'no arrow crosses a box');
process.exit(bad ? 1 : 0);
