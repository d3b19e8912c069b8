// The contract scenario from Node: protos loaded at run time, real services on loopback.
// Targets: MAILQUEUE_ENQUEUE_TARGET, MAILQUEUE_DEQUEUE_TARGET, MAILQUEUE_BROWSE_TARGET (defaults: localhost ports).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
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

test('the contract scenario', async () => {
  const queue = `contract-node-${randomBytes(4).toString('hex')}`;
  await unary(admin, 'CreateQueue', { queue });

  // Three mails: the null sender; two recipients with per-recipient headers; 5 MiB, streamed.
  const a = await unary(enqueue, 'Enqueue', {
    queue, mail: { name: 'a', sender: '', recipients: ['a@example.org'] }, inline_content: Buffer.from('Subject: a\r\n\r\nA'),
  });
  const headers = [{ recipient: 'r1@example.org', headers: [{ name: 'X-Tag', value: 'one' }] }];
  const b = await unary(enqueue, 'Enqueue', {
    queue, mail: { name: 'b', sender: 's@example.com', recipients: ['r1@example.org', 'r2@example.org'], per_recipient_headers: headers },
    inline_content: Buffer.from('Subject: b\r\n\r\nB'),
  });
  const big = randomBytes(5 * 1024 * 1024);
  const c = await new Promise((resolve, reject) => {
    const call = enqueue.EnqueueStream((err, r) => (err ? reject(err) : resolve(r)));
    call.write({ header: { queue, mail: { name: 'c', sender: 's@example.com', recipients: ['c@example.org'] } } });
    for (let i = 0; i < big.length; i += 1024 * 1024) call.write({ chunk: big.subarray(i, i + 1024 * 1024) });
    call.end();
  });
  assert.equal(c.receipt.size, big.length);

  // Browse: order and fields.
  const listed = await collect(browse.Browse({ queue }));
  assert.deepEqual(listed.map((r) => r.mail.mail.name), ['a', 'b', 'c']);
  assert.deepEqual(listed.map((r) => r.mail.enqueue_id), [a, b, c].map((r) => r.receipt.enqueue_id));
  assert.equal(listed[0].mail.mail.sender, '');
  assert.deepEqual(listed[1].mail.mail.recipients, ['r1@example.org', 'r2@example.org']);
  assert.equal(listed[1].mail.mail.per_recipient_headers[0].headers[0].value, 'one');
  assert.equal(listed[2].mail.size, big.length);
  assert.equal((await unary(browse, 'GetSize', { queue, exact: true })).size, 3);

  // Dequeue all three on one stream: RETRY the first, then SUCCESS everything.
  await new Promise((resolve, reject) => {
    const call = dequeue.Dequeue();
    const seen = [];
    let retried = null;
    call.on('data', (r) => {
      if (r.kind !== 'delivery') return;
      const d = r.delivery;
      seen.push(d.mail.mail.name);
      if (retried === null) {
        retried = d.mail.enqueue_id;
        call.write({ outcome: { delivery_tag: d.delivery_tag, kind: 'OUTCOME_KIND_RETRY', retry_after: { seconds: 0 } } });
        return;
      }
      if (d.mail.enqueue_id === retried) { assert.equal(d.redelivered, true); assert.equal(d.mail.attempts, 1); }
      if (d.mail.mail.name === 'c') assert.equal(d.content_inline, false); // above the inline threshold
      else assert.equal(d.content_inline, true);
      call.write({ outcome: { delivery_tag: d.delivery_tag, kind: 'OUTCOME_KIND_SUCCESS' } });
      if (seen.length === 4) call.end();
    });
    call.on('end', () => { assert.equal(seen.length, 4); resolve(); });
    call.on('error', reject);
    call.write({ subscribe: { queue, prefetch: 3 } });
  });

  // Delete by sender on a fourth mail; the size ends at 0.
  await unary(enqueue, 'Enqueue', {
    queue, mail: { name: 'd', sender: 'spam@example.net', recipients: ['d@example.org'] }, inline_content: Buffer.from('x'),
  });
  const progress = await collect(admin.DeleteMails({ queue, sender: 'spam@example.net' }));
  assert.equal(progress.at(-1).progress.done, true);
  assert.equal(progress.at(-1).progress.deleted, 1);
  assert.equal((await unary(browse, 'GetSize', { queue, exact: true })).size, 0);
});

test('an invalid recipient is INVALID_ARGUMENT', async () => {
  const queue = `contract-node-${randomBytes(4).toString('hex')}`;
  await unary(admin, 'CreateQueue', { queue });
  await assert.rejects(
    unary(enqueue, 'Enqueue', { queue, mail: { sender: '', recipients: ['not an address'] }, inline_content: Buffer.from('x') }),
    (err) => err.code === grpc.status.INVALID_ARGUMENT,
  );
});

test('EnqueueMany answers each mail on one stream', async () => {
  const queue = `contract-node-${randomBytes(4).toString('hex')}`;
  await unary(admin, 'CreateQueue', { queue });
  const answers = await new Promise((resolve, reject) => {
    const got = [];
    const call = enqueue.EnqueueMany();
    call.on('data', (r) => got.push(r));
    call.on('end', () => resolve(got));
    call.on('error', reject);
    for (let i = 0; i < 20; i += 1) {
      const recipients = i === 5 ? ['not an address'] : ['r@example.org'];
      call.write({ sequence: i, request: { queue, mail: { name: 'many', recipients }, inline_content: Buffer.from('x') } });
    }
    call.end();
  });
  assert.equal(answers.length, 20);
  const refused = answers.filter((a) => a.result === 'error');
  assert.equal(refused.length, 1);
  assert.equal(Number(refused[0].sequence), 5);
  assert.equal(refused[0].error.code, grpc.status.INVALID_ARGUMENT);
  assert.equal((await unary(browse, 'GetSize', { queue, exact: true })).size, 19);
});
