// The contract scenarios of ../scenarios.json from Node: stubs that `buf generate` writes from
// protos/ (protoc-gen-es, into ./gen), called over gRPC with Connect's Node transport, against the
// real services on loopback. The Go client runs the same file (../go/contract_test.go); each step
// kind is described in the file itself.
// Targets: MAILQUEUE_ENQUEUE_TARGET, MAILQUEUE_DEQUEUE_TARGET, MAILQUEUE_BROWSE_TARGET (defaults: localhost ports).
import { after, test } from 'node:test';
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { fromJson, toJson } from '@bufbuild/protobuf';
import { Code, ConnectError, createClient } from '@connectrpc/connect';
import { createGrpcTransport } from '@connectrpc/connect-node';
import { AdminService } from './gen/mailqueue/v1/admin_pb.js';
import { BrowseService } from './gen/mailqueue/v1/browse_pb.js';
import { DequeueService, OutcomeKind } from './gen/mailqueue/v1/dequeue_pb.js';
import { EnqueueService } from './gen/mailqueue/v1/enqueue_pb.js';
import { MailSchema, QueuedMailSchema } from './gen/mailqueue/v1/mail_pb.js';
import { QuotaKind } from './gen/mailqueue/v1/quotas_pb.js';
import { BinaryReader } from '@bufbuild/protobuf/wire';

// MAILQUEUE_TLS_CA, when set, is the CA file to trust: the calls go over TLS.
const tlsCa = process.env.MAILQUEUE_TLS_CA;
const client = (service, name, port) => createClient(service, createGrpcTransport({
  baseUrl: `${tlsCa ? 'https' : 'http'}://${process.env[`MAILQUEUE_${name}_TARGET`] || `localhost:${port}`}`,
  ...(tlsCa ? { nodeOptions: { ca: readFileSync(tlsCa) } } : {}),
}));
const enqueue = client(EnqueueService, 'ENQUEUE', 50051);
const dequeue = client(DequeueService, 'DEQUEUE', 50052);
const browse = client(BrowseService, 'BROWSE', 50053);
const admin = client(AdminService, 'BROWSE', 50053);

const collect = async (stream) => {
  const out = [];
  for await (const m of stream) out.push(m);
  return out;
};
// "INVALID_ARGUMENT" -> Code.InvalidArgument (the gRPC status names of the scenario file).
const code = (name) => Code[name.toLowerCase().replace(/(^|_)(\w)/g, (_m, _u, c) => c.toUpperCase())];
const inline = (queue, mail, content) => ({ queue, mail, content: { case: 'inlineContent', value: content } });
const mailOf = (json) => fromJson(MailSchema, json);

// Requests for a bidirectional stream that the client writes as answers come in.
function pushable() {
  const items = [];
  let wake = null;
  let ended = false;
  const poke = () => { if (wake) { wake(); wake = null; } };
  return {
    push(item) { items.push(item); poke(); },
    end() { ended = true; poke(); },
    async* [Symbol.asyncIterator]() {
      for (;;) {
        if (items.length) yield items.shift();
        else if (ended) return;
        else await new Promise((resolve) => { wake = resolve; });
      }
    },
  };
}

// The google.rpc details of a status as Connect hands them over (the grpc-status-details-bin
// trailer, decoded into google.protobuf.Any type and bytes), read with the protobuf runtime's
// wire reader: the google.rpc schemas are not generated for Node here (only protos/ is).
const RPC = 'google.rpc.';
function readRetryInfo(bytes) { // RetryInfo { Duration retry_delay = 1 } -> seconds
  const r = new BinaryReader(bytes);
  let seconds = 0;
  while (r.pos < r.len) {
    const [field, wire] = r.tag();
    if (field !== 1) { r.skip(wire); continue; }
    const d = new BinaryReader(r.bytes());
    while (d.pos < d.len) {
      const [f, w] = d.tag();
      if (f === 1) seconds += Number(d.int64());
      else if (f === 2) seconds += d.int32() / 1e9;
      else d.skip(w);
    }
  }
  return seconds;
}
function readQuotaFailure(bytes) { // QuotaFailure { repeated Violation { subject = 1, description = 2 } violations = 1 }
  const r = new BinaryReader(bytes);
  const violations = [];
  while (r.pos < r.len) {
    const [field, wire] = r.tag();
    if (field !== 1) { r.skip(wire); continue; }
    const v = new BinaryReader(r.bytes());
    const violation = { subject: '', description: '' };
    while (v.pos < v.len) {
      const [f, w] = v.tag();
      if (f === 1) violation.subject = v.string();
      else if (f === 2) violation.description = v.string();
      else v.skip(w);
    }
    violations.push(violation);
  }
  return violations;
}

const { scenarios } = JSON.parse(readFileSync(new URL('../scenarios.json', import.meta.url), 'utf8'));

const steps = {
  async enqueue(ctx, s) {
    const content = s.random_bytes ? randomBytes(s.random_bytes) : Buffer.from(s.content);
    const call = enqueue.enqueue(inline(ctx.queue, mailOf(s.mail), content));
    if (s.code) {
      await assert.rejects(call, (err) => err instanceof ConnectError && err.code === code(s.code));
      return;
    }
    const r = await call;
    if (s.label) ctx.ids[s.label] = r.receipt.enqueueId;
  },

  async enqueue_stream(ctx, s) {
    const big = randomBytes(s.random_bytes);
    async function* parts() {
      yield { part: { case: 'header', value: { queue: ctx.queue, mail: mailOf(s.mail) } } };
      for (let i = 0; i < big.length; i += 1024 * 1024) yield { part: { case: 'chunk', value: big.subarray(i, i + 1024 * 1024) } };
    }
    const r = await enqueue.enqueueStream(parts());
    assert.equal(Number(r.receipt.size), big.length);
    ctx.ids[s.label] = r.receipt.enqueueId;
  },

  async enqueue_many(ctx, s) {
    const bad = new Set(s.invalid_recipient_at);
    async function* requests() {
      for (let i = 0; i < s.count; i += 1) {
        const recipients = bad.has(i) ? ['not an address'] : ['r@example.org'];
        yield { sequence: BigInt(i), request: inline(ctx.queue, { name: 'many', recipients }, Buffer.from('x')) };
      }
    }
    const answers = await collect(enqueue.enqueueMany(requests()));
    assert.equal(answers.length, s.count);
    const refused = answers.filter((a) => a.result.case === 'error');
    assert.deepEqual(refused.map((a) => Number(a.sequence)).sort((x, y) => x - y), [...bad].sort((x, y) => x - y));
    for (const a of refused) assert.equal(a.result.value.code, Code.InvalidArgument);
  },

  async enqueue_batches(ctx, s) {
    async function* batches() {
      for (let i = 0; i < s.count; i += s.batch) {
        const mails = [];
        for (let j = i; j < Math.min(i + s.batch, s.count); j += 1) {
          mails.push({ sequence: BigInt(j), request: inline(ctx.queue, { name: 'batch', recipients: ['r@example.org'] }, Buffer.from('x')) });
        }
        yield { mails };
      }
    }
    const answers = (await collect(enqueue.enqueueBatches(batches()))).flatMap((r) => r.results);
    assert.deepEqual(answers.map((a) => Number(a.sequence)).sort((x, y) => x - y), [...Array(s.count).keys()]);
    assert.ok(answers.every((a) => a.result.case === 'receipt'));
  },

  async browse(ctx, s) {
    const listed = (await collect(browse.browse({ queue: ctx.queue }))).map((r) => r.mail);
    assert.deepEqual(listed.map((m) => m.enqueueId), s.labels.map((l) => ctx.ids[l]));
    // Field paths name proto fields (snake_case), as the Go client reads them.
    const asJson = listed.map((m) => toJson(QueuedMailSchema, m, { useProtoFieldName: true, alwaysEmitImplicit: true }));
    for (const [path, value] of Object.entries(s.fields)) {
      const found = path.split('.').reduce((at, key) => (at === undefined ? undefined : at[key]), asJson);
      assert.equal(String(found), value, path);
    }
  },

  async browse_pages(ctx, s) {
    // One call's enqueue ids, and the next page's token: the last message's value.
    const ids = async (request) => {
      const out = [];
      let token = '';
      for await (const r of browse.browse(request)) {
        out.push(r.mail.enqueueId);
        token = r.nextPageToken;
      }
      return [out, token];
    };
    const [all] = await ids({ queue: ctx.queue });
    const paged = [];
    let token = '';
    let pages = 0;
    do {
      const [page, next] = await ids({ queue: ctx.queue, pageSize: s.page_size, pageToken: token });
      paged.push(...page);
      pages += 1;
      token = next;
    } while (token);
    assert.equal(all.length, s.count);
    assert.deepEqual(paged, all);
    assert.equal(pages, s.pages);
  },

  async size(ctx, s) {
    assert.equal(Number((await browse.getSize({ queue: ctx.queue, exact: true })).size), s.expect);
  },

  async dequeue(ctx, s) {
    const notInline = new Set(s.not_inline);
    const requests = pushable();
    requests.push({ kind: { case: 'subscribe', value: { queue: ctx.queue, prefetch: s.prefetch } } });
    let seen = 0;
    let retried = null;
    for await (const r of dequeue.dequeue(requests)) {
      if (r.kind.case !== 'delivery') continue;
      const d = r.kind.value;
      seen += 1;
      assert.equal(d.contentInline, !notInline.has(d.mail.mail.name), `content_inline of ${d.mail.mail.name}`);
      if (retried === null) {
        retried = d.mail.enqueueId;
        requests.push({ kind: { case: 'outcome', value: { deliveryTag: d.deliveryTag, kind: OutcomeKind.RETRY, retryAfter: { seconds: 0n } } } });
      } else {
        if (d.mail.enqueueId === retried) { assert.equal(d.redelivered, true); assert.equal(d.mail.attempts, 1); }
        requests.push({ kind: { case: 'outcome', value: { deliveryTag: d.deliveryTag, kind: OutcomeKind.SUCCESS } } });
      }
      if (seen === s.deliveries) requests.end();
    }
    assert.equal(seen, s.deliveries);
  },

  async dequeue_batch(ctx, s) {
    const requests = pushable();
    requests.push({ kind: { case: 'subscribe', value: { queue: ctx.queue, prefetch: s.prefetch, maxBatch: s.max_batch } } });
    let seen = 0;
    for await (const r of dequeue.dequeue(requests)) {
      if (r.kind.case !== 'deliveries') continue;
      const batch = r.kind.value.deliveries;
      assert.ok(batch.length >= 1 && batch.length <= s.max_batch, `a Deliveries message with ${batch.length}`);
      seen += batch.length;
      const outcomes = batch.map((d) => ({ deliveryTag: d.deliveryTag, kind: OutcomeKind.SUCCESS }));
      requests.push({ kind: { case: 'outcomes', value: { outcomes } } });
      if (seen >= s.deliveries) requests.end();
    }
    assert.equal(seen, s.deliveries);
  },

  // Set a quota on the scenario's queue, enqueue until one is refused RESOURCE_EXHAUSTED (the
  // quota reaches the replica within about a second), decode RetryInfo and QuotaFailure; clear it.
  async quota_refusal(ctx, s) {
    const quota = { kind: QuotaKind.QUEUE, subject: ctx.queue, mailsPerS: s.mails_per_s, burstMails: BigInt(s.burst) };
    await admin.setQuota({ quota });
    try {
      const mail = mailOf({ name: 'quota', sender: 'q@example.com', recipients: ['r@example.org'] });
      const deadline = Date.now() + 10_000;
      for (;;) {
        try {
          await enqueue.enqueue(inline(ctx.queue, mail, Buffer.from('Subject: q\r\n\r\nq')));
        } catch (err) {
          assert.ok(err instanceof ConnectError && err.code === Code.ResourceExhausted, String(err));
          const detail = (name) => err.details.find((d) => d.type === RPC + name);
          assert.ok(detail('RetryInfo') && readRetryInfo(detail('RetryInfo').value) > 0, 'RetryInfo with a delay');
          const violations = readQuotaFailure(detail('QuotaFailure').value);
          assert.deepEqual(violations.map((v) => v.subject), [`queue:${ctx.queue}`]);
          return;
        }
        assert.ok(Date.now() < deadline, 'no RESOURCE_EXHAUSTED within 10 s of SetQuota');
      }
    } finally {
      await admin.clearQuota({ kind: QuotaKind.QUEUE, subject: ctx.queue });
    }
  },

  async delete_by_sender(ctx, s) {
    const progress = await collect(admin.deleteMails({ queue: ctx.queue, condition: { case: 'sender', value: s.sender } }));
    assert.equal(progress.at(-1).progress.done, true);
    assert.equal(Number(progress.at(-1).progress.deleted), s.deleted);
  },
};

// The scenarios' queues, deleted with whatever each left in it once all have run, all at once:
// each DeleteQueue waits out the services' queue-state TTL (10 s by default) before it removes
// the broker queues, so one after another they would cost that wait per scenario.
const queues = [];
after(() => Promise.all(queues.map((queue) => collect(admin.deleteQueue({ queue, force: true }, { timeoutMs: 120000 })))));

for (const scenario of scenarios) {
  test(scenario.name, async () => {
    const ctx = { queue: `contract-node-${randomBytes(4).toString('hex')}`, ids: {} };
    await admin.createQueue({ queue: ctx.queue });
    queues.push(ctx.queue);
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
