// The contract scenarios of ../scenarios.json from Node: protos loaded at run time, real services
// on loopback. The Go client runs the same file (../go/contract_test.go); each step kind is
// described in the file itself.
// Targets: MAILQUEUE_ENQUEUE_TARGET, MAILQUEUE_DEQUEUE_TARGET, MAILQUEUE_BROWSE_TARGET (defaults: localhost ports).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import grpc from '@grpc/grpc-js';
import protoLoader from '@grpc/proto-loader';

const protos = fileURLToPath(new URL('../../../protos/', import.meta.url));
const definition = protoLoader.loadSync(
  ['mailqueue/v1/enqueue.proto', 'mailqueue/v1/dequeue.proto', 'mailqueue/v1/browse.proto', 'mailqueue/v1/admin.proto'],
  { includeDirs: [protos], keepCase: true, longs: Number, enums: String, defaults: true, oneofs: true },
);
const v1 = grpc.loadPackageDefinition(definition).mailqueue.v1;
const insecure = grpc.credentials.createInsecure();
const target = (name, port) => process.env[`MAILQUEUE_${name}_TARGET`] || `localhost:${port}`;
const enqueue = new v1.EnqueueService(target('ENQUEUE', 50051), insecure);
const dequeue = new v1.DequeueService(target('DEQUEUE', 50052), insecure);
const browse = new v1.BrowseService(target('BROWSE', 50053), insecure);
const admin = new v1.AdminService(target('BROWSE', 50053), insecure);

const unary = (client, method, request) =>
  new Promise((resolve, reject) => client[method](request, (err, response) => (err ? reject(err) : resolve(response))));
const collect = (call) =>
  new Promise((resolve, reject) => {
    const out = [];
    call.on('data', (m) => out.push(m));
    call.on('end', () => resolve(out));
    call.on('error', reject);
  });

const { scenarios } = JSON.parse(readFileSync(new URL('../scenarios.json', import.meta.url), 'utf8'));

const steps = {
  async enqueue(ctx, s) {
    const content = s.random_bytes ? randomBytes(s.random_bytes) : Buffer.from(s.content);
    const call = unary(enqueue, 'Enqueue', { queue: ctx.queue, mail: s.mail, inline_content: content });
    if (s.code) {
      await assert.rejects(call, (err) => err.code === grpc.status[s.code]);
      return;
    }
    const r = await call;
    if (s.label) ctx.ids[s.label] = r.receipt.enqueue_id;
  },

  async enqueue_stream(ctx, s) {
    const big = randomBytes(s.random_bytes);
    const r = await new Promise((resolve, reject) => {
      const call = enqueue.EnqueueStream((err, resp) => (err ? reject(err) : resolve(resp)));
      call.write({ header: { queue: ctx.queue, mail: s.mail } });
      for (let i = 0; i < big.length; i += 1024 * 1024) call.write({ chunk: big.subarray(i, i + 1024 * 1024) });
      call.end();
    });
    assert.equal(r.receipt.size, big.length);
    ctx.ids[s.label] = r.receipt.enqueue_id;
  },

  async enqueue_many(ctx, s) {
    const bad = new Set(s.invalid_recipient_at);
    const answers = await new Promise((resolve, reject) => {
      const got = [];
      const call = enqueue.EnqueueMany();
      call.on('data', (r) => got.push(r));
      call.on('end', () => resolve(got));
      call.on('error', reject);
      for (let i = 0; i < s.count; i += 1) {
        const recipients = bad.has(i) ? ['not an address'] : ['r@example.org'];
        call.write({ sequence: i, request: { queue: ctx.queue, mail: { name: 'many', recipients }, inline_content: Buffer.from('x') } });
      }
      call.end();
    });
    assert.equal(answers.length, s.count);
    const refused = answers.filter((a) => a.result === 'error');
    assert.deepEqual(refused.map((a) => Number(a.sequence)).sort((x, y) => x - y), [...bad].sort((x, y) => x - y));
    for (const a of refused) assert.equal(a.error.code, grpc.status.INVALID_ARGUMENT);
  },

  async browse(ctx, s) {
    const listed = (await collect(browse.Browse({ queue: ctx.queue }))).map((r) => r.mail);
    assert.deepEqual(listed.map((m) => m.enqueue_id), s.labels.map((l) => ctx.ids[l]));
    for (const [path, value] of Object.entries(s.fields)) {
      const found = path.split('.').reduce((at, key) => (at === undefined ? undefined : at[key]), listed);
      assert.equal(String(found), value, path);
    }
  },

  async size(ctx, s) {
    assert.equal(Number((await unary(browse, 'GetSize', { queue: ctx.queue, exact: true })).size), s.expect);
  },

  async dequeue(ctx, s) {
    const notInline = new Set(s.not_inline);
    await new Promise((resolve, reject) => {
      const call = dequeue.Dequeue();
      let seen = 0;
      let retried = null;
      call.on('data', (r) => {
        if (r.kind !== 'delivery') return;
        const d = r.delivery;
        seen += 1;
        try {
          assert.equal(d.content_inline, !notInline.has(d.mail.mail.name), `content_inline of ${d.mail.mail.name}`);
          if (retried === null) {
            retried = d.mail.enqueue_id;
            call.write({ outcome: { delivery_tag: d.delivery_tag, kind: 'OUTCOME_KIND_RETRY', retry_after: { seconds: 0 } } });
          } else {
            if (d.mail.enqueue_id === retried) { assert.equal(d.redelivered, true); assert.equal(d.mail.attempts, 1); }
            call.write({ outcome: { delivery_tag: d.delivery_tag, kind: 'OUTCOME_KIND_SUCCESS' } });
          }
        } catch (e) { reject(e); call.cancel(); return; }
        if (seen === s.deliveries) call.end();
      });
      call.on('end', () => { if (seen === s.deliveries) resolve(); else reject(new Error(`${seen} deliveries`)); });
      call.on('error', reject);
      call.write({ subscribe: { queue: ctx.queue, prefetch: s.prefetch } });
    });
  },

  async enqueue_batches(ctx, s) {
    const answers = await new Promise((resolve, reject) => {
      const got = [];
      const call = enqueue.EnqueueBatches();
      call.on('data', (r) => got.push(...r.results));
      call.on('end', () => resolve(got));
      call.on('error', reject);
      for (let i = 0; i < s.count; i += s.batch) {
        const mails = [];
        for (let j = i; j < Math.min(i + s.batch, s.count); j += 1) {
          mails.push({ sequence: j, request: { queue: ctx.queue, mail: { name: 'batch', recipients: ['r@example.org'] }, inline_content: Buffer.from('x') } });
        }
        call.write({ mails });
      }
      call.end();
    });
    assert.deepEqual(answers.map((a) => Number(a.sequence)).sort((x, y) => x - y), [...Array(s.count).keys()]);
    assert.ok(answers.every((a) => a.result === 'receipt'));
  },

  async dequeue_batch(ctx, s) {
    await new Promise((resolve, reject) => {
      const call = dequeue.Dequeue();
      let seen = 0;
      call.on('data', (r) => {
        if (r.kind !== 'deliveries') return;
        const batch = r.deliveries.deliveries;
        try {
          assert.ok(batch.length >= 1 && batch.length <= s.max_batch, `a Deliveries message with ${batch.length}`);
        } catch (e) { reject(e); call.cancel(); return; }
        seen += batch.length;
        call.write({ outcomes: { outcomes: batch.map((d) => ({ delivery_tag: d.delivery_tag, kind: 'OUTCOME_KIND_SUCCESS' })) } });
        if (seen >= s.deliveries) call.end();
      });
      call.on('end', () => { if (seen === s.deliveries) resolve(); else reject(new Error(`${seen} deliveries`)); });
      call.on('error', reject);
      call.write({ subscribe: { queue: ctx.queue, prefetch: s.prefetch, max_batch: s.max_batch } });
    });
  },

  async delete_by_sender(ctx, s) {
    const progress = await collect(admin.DeleteMails({ queue: ctx.queue, sender: s.sender }));
    assert.equal(progress.at(-1).progress.done, true);
    assert.equal(Number(progress.at(-1).progress.deleted), s.deleted);
  },
};

for (const scenario of scenarios) {
  test(scenario.name, async () => {
    const ctx = { queue: `contract-node-${randomBytes(4).toString('hex')}`, ids: {} };
    await unary(admin, 'CreateQueue', { queue: ctx.queue });
    for (const [i, s] of scenario.steps.entries()) {
      const run = steps[s.op];
      assert.ok(run, `step ${i}: unknown op ${s.op}`);
      try {
        await run(ctx, s);
      } catch (e) {
        e.message = `step ${i} (${s.op}): ${e.message}`;
        throw e;
      }
    }
  });
}
