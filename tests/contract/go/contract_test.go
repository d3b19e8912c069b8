// The contract scenario from Go: stubs generated from protos/ with protoc-gen-go and
// protoc-gen-go-grpc, real services on loopback.
// Targets: MAILQUEUE_ENQUEUE_TARGET, MAILQUEUE_DEQUEUE_TARGET, MAILQUEUE_BROWSE_TARGET.
package contract

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"io"
	"os"
	"testing"
	"time"

	mq "github.com/mailqueue/mailqueue/gen/go/mailqueue/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
)

func dial(t *testing.T, env, fallback string) *grpc.ClientConn {
	target := os.Getenv(env)
	if target == "" {
		target = fallback
	}
	conn, err := grpc.NewClient(target, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(16<<20)))
	if err != nil {
		t.Fatalf("dial %s: %v", target, err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

type clients struct {
	enqueue mq.EnqueueServiceClient
	dequeue mq.DequeueServiceClient
	browse  mq.BrowseServiceClient
	admin   mq.AdminServiceClient
}

func connect(t *testing.T) clients {
	b := dial(t, "MAILQUEUE_BROWSE_TARGET", "localhost:50053")
	return clients{
		enqueue: mq.NewEnqueueServiceClient(dial(t, "MAILQUEUE_ENQUEUE_TARGET", "localhost:50051")),
		dequeue: mq.NewDequeueServiceClient(dial(t, "MAILQUEUE_DEQUEUE_TARGET", "localhost:50052")),
		browse:  mq.NewBrowseServiceClient(b),
		admin:   mq.NewAdminServiceClient(b),
	}
}

func randomBytes(n int) []byte {
	b := make([]byte, n)
	rand.Read(b)
	return b
}

func newQueue(t *testing.T, ctx context.Context, c clients) string {
	queue := "contract-go-" + hex.EncodeToString(randomBytes(4))
	if _, err := c.admin.CreateQueue(ctx, &mq.CreateQueueRequest{Queue: queue}); err != nil {
		t.Fatalf("CreateQueue: %v", err)
	}
	return queue
}

func inline(queue string, mail *mq.Mail, content []byte) *mq.EnqueueRequest {
	return &mq.EnqueueRequest{Queue: queue, Mail: mail, Content: &mq.EnqueueRequest_InlineContent{InlineContent: content}}
}

func TestContractScenario(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c := connect(t)
	queue := newQueue(t, ctx, c)

	// Three mails: the null sender; two recipients with per-recipient headers; 5 MiB, streamed.
	a, err := c.enqueue.Enqueue(ctx, inline(queue, &mq.Mail{Name: "a", Sender: "", Recipients: []string{"a@example.org"}}, []byte("Subject: a\r\n\r\nA")))
	if err != nil {
		t.Fatalf("Enqueue a: %v", err)
	}
	headers := []*mq.PerRecipientHeaders{{Recipient: "r1@example.org", Headers: []*mq.Header{{Name: "X-Tag", Value: "one"}}}}
	b, err := c.enqueue.Enqueue(ctx, inline(queue, &mq.Mail{Name: "b", Sender: "s@example.com",
		Recipients: []string{"r1@example.org", "r2@example.org"}, PerRecipientHeaders: headers}, []byte("Subject: b\r\n\r\nB")))
	if err != nil {
		t.Fatalf("Enqueue b: %v", err)
	}
	big := randomBytes(5 << 20)
	stream, err := c.enqueue.EnqueueStream(ctx)
	if err != nil {
		t.Fatalf("EnqueueStream: %v", err)
	}
	stream.Send(&mq.EnqueueStreamRequest{Part: &mq.EnqueueStreamRequest_Header{Header: &mq.EnqueueHeader{
		Queue: queue, Mail: &mq.Mail{Name: "c", Sender: "s@example.com", Recipients: []string{"c@example.org"}}}}})
	for i := 0; i < len(big); i += 1 << 20 {
		stream.Send(&mq.EnqueueStreamRequest{Part: &mq.EnqueueStreamRequest_Chunk{Chunk: big[i : i+1<<20]}})
	}
	cr, err := stream.CloseAndRecv()
	if err != nil || cr.Receipt.Size != int64(len(big)) {
		t.Fatalf("EnqueueStream c: %v %v", cr, err)
	}

	// Browse: order and fields.
	browse, err := c.browse.Browse(ctx, &mq.BrowseRequest{Queue: queue})
	if err != nil {
		t.Fatalf("Browse: %v", err)
	}
	var listed []*mq.QueuedMail
	for {
		r, err := browse.Recv()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("Browse: %v", err)
		}
		listed = append(listed, r.Mail)
	}
	want := []string{a.Receipt.EnqueueId, b.Receipt.EnqueueId, cr.Receipt.EnqueueId}
	if len(listed) != 3 {
		t.Fatalf("browse listed %d mails, want 3", len(listed))
	}
	for i, m := range listed {
		if m.EnqueueId != want[i] {
			t.Fatalf("browse order: %d is %s, want %s", i, m.EnqueueId, want[i])
		}
	}
	if listed[0].Mail.Sender != "" || len(listed[1].Mail.Recipients) != 2 ||
		listed[1].Mail.PerRecipientHeaders[0].Headers[0].Value != "one" || listed[2].Size != int64(len(big)) {
		t.Fatalf("browse fields: %v", listed)
	}
	size, err := c.browse.GetSize(ctx, &mq.GetSizeRequest{Queue: queue, Exact: true})
	if err != nil || size.Size != 3 {
		t.Fatalf("GetSize = %v, %v; want 3", size, err)
	}

	// Dequeue all three on one stream: RETRY the first, then SUCCESS everything.
	dq, err := c.dequeue.Dequeue(ctx)
	if err != nil {
		t.Fatalf("Dequeue: %v", err)
	}
	dq.Send(&mq.DequeueRequest{Kind: &mq.DequeueRequest_Subscribe{Subscribe: &mq.Subscribe{Queue: queue, Prefetch: 3}}})
	retried, deliveries := "", 0
	for deliveries < 4 {
		r, err := dq.Recv()
		if err != nil {
			t.Fatalf("Dequeue recv: %v", err)
		}
		d := r.GetDelivery()
		if d == nil {
			continue
		}
		deliveries++
		kind := mq.OutcomeKind_OUTCOME_KIND_SUCCESS
		if retried == "" {
			retried, kind = d.Mail.EnqueueId, mq.OutcomeKind_OUTCOME_KIND_RETRY
		} else if d.Mail.EnqueueId == retried && (!d.Redelivered || d.Mail.Attempts != 1) {
			t.Fatalf("a retried mail must come back marked redelivered with 1 attempt: %v", d)
		}
		if (d.Mail.Mail.Name == "c") == d.ContentInline {
			t.Fatalf("content_inline of %s is %v", d.Mail.Mail.Name, d.ContentInline)
		}
		outcome := &mq.Outcome{DeliveryTag: d.DeliveryTag, Kind: kind}
		if kind == mq.OutcomeKind_OUTCOME_KIND_RETRY {
			outcome.RetryAfter = durationpb.New(0) // at once, not after the queue's backoff
		}
		dq.Send(&mq.DequeueRequest{Kind: &mq.DequeueRequest_Outcome{Outcome: outcome}})
	}
	dq.CloseSend()
	for {
		if _, err := dq.Recv(); err == io.EOF {
			break
		} else if err != nil {
			t.Fatalf("Dequeue end: %v", err)
		}
	}

	// Delete by sender on a fourth mail; the size ends at 0.
	if _, err := c.enqueue.Enqueue(ctx, inline(queue, &mq.Mail{Name: "d", Sender: "spam@example.net", Recipients: []string{"d@example.org"}}, []byte("x"))); err != nil {
		t.Fatalf("Enqueue d: %v", err)
	}
	del, err := c.admin.DeleteMails(ctx, &mq.DeleteMailsRequest{Queue: queue, Condition: &mq.DeleteMailsRequest_Sender{Sender: "spam@example.net"}})
	if err != nil {
		t.Fatalf("DeleteMails: %v", err)
	}
	var last *mq.DeleteProgress
	for {
		r, err := del.Recv()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("DeleteMails: %v", err)
		}
		last = r.Progress
	}
	if last == nil || !last.Done || last.Deleted != 1 {
		t.Fatalf("DeleteMails final progress %v, want done with 1 deleted", last)
	}
	if size, err := c.browse.GetSize(ctx, &mq.GetSizeRequest{Queue: queue, Exact: true}); err != nil || size.Size != 0 {
		t.Fatalf("GetSize = %v, %v; want 0", size, err)
	}
}

func TestInvalidRecipientIsInvalidArgument(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c := connect(t)
	queue := newQueue(t, ctx, c)
	_, err := c.enqueue.Enqueue(ctx, inline(queue, &mq.Mail{Recipients: []string{"not an address"}}, []byte("x")))
	if status.Code(err) != codes.InvalidArgument {
		t.Fatalf("got %v, want INVALID_ARGUMENT", err)
	}
}

func TestEnqueueManyAnswersEachMailOnOneStream(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c := connect(t)
	queue := newQueue(t, ctx, c)
	stream, err := c.enqueue.EnqueueMany(ctx)
	if err != nil {
		t.Fatalf("EnqueueMany: %v", err)
	}
	for i := 0; i < 20; i++ {
		mail := &mq.Mail{Name: "many", Recipients: []string{"r@example.org"}}
		if i == 5 {
			mail.Recipients = []string{"not an address"}
		}
		if err := stream.Send(&mq.EnqueueManyRequest{Sequence: uint64(i), Request: inline(queue, mail, []byte("x"))}); err != nil {
			t.Fatalf("EnqueueMany send: %v", err)
		}
	}
	stream.CloseSend()
	receipts, refused := map[uint64]string{}, map[uint64]int32{}
	for {
		r, err := stream.Recv()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("EnqueueMany recv: %v", err)
		}
		if r.GetReceipt() != nil {
			receipts[r.Sequence] = r.GetReceipt().EnqueueId
		} else {
			refused[r.Sequence] = r.GetError().Code
		}
	}
	if len(receipts) != 19 || len(refused) != 1 || refused[5] != int32(codes.InvalidArgument) {
		t.Fatalf("EnqueueMany: %d receipts, refused %v; want 19 and {5: INVALID_ARGUMENT}", len(receipts), refused)
	}
	if size, err := c.browse.GetSize(ctx, &mq.GetSizeRequest{Queue: queue, Exact: true}); err != nil || size.Size != 19 {
		t.Fatalf("GetSize = %v, %v; want 19", size, err)
	}
}
