// The contract scenarios of ../scenarios.json from Go: stubs generated from protos/ with
// protoc-gen-go and protoc-gen-go-grpc, real services on loopback. The Node client runs the same
// file (../node/contract.test.mjs); each step kind is described in the file itself.
// Targets: MAILQUEUE_ENQUEUE_TARGET, MAILQUEUE_DEQUEUE_TARGET, MAILQUEUE_BROWSE_TARGET (gRPC target
// strings: "host:port", or "ipv4:127.0.0.1:50051,127.0.0.1:50151" balanced round robin).
// MAILQUEUE_TOKEN, when set, is sent on every call as "authorization: Bearer <token>".
// MAILQUEUE_TLS_CA, when set, is the CA file to trust: the calls go over TLS.
package contract

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	mq "github.com/mailqueue/mailqueue/gen/go/mailqueue/v1"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/resolver/manual"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/durationpb"
)

func dial(t *testing.T, env, fallback string) *grpc.ClientConn {
	target := os.Getenv(env)
	if target == "" {
		target = fallback
	}
	transport := insecure.NewCredentials()
	if ca := os.Getenv("MAILQUEUE_TLS_CA"); ca != "" {
		var err error
		if transport, err = credentials.NewClientTLSFromFile(ca, ""); err != nil {
			t.Fatalf("MAILQUEUE_TLS_CA=%s: %v", ca, err)
		}
	}
	opts := []grpc.DialOption{grpc.WithTransportCredentials(transport),
		// WaitForReady: a call waits (within its deadline) for a replica that is connected rather
		// than failing on the first one that refuses, as a client of a scaled Service should.
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(16<<20), grpc.WaitForReady(true)),
		grpc.WithDefaultServiceConfig(`{"loadBalancingConfig": [{"round_robin": {}}]}`)}
	if token := os.Getenv("MAILQUEUE_TOKEN"); token != "" {
		opts = append(opts, grpc.WithUnaryInterceptor(
			func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, o ...grpc.CallOption) error {
				return invoker(metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+token), method, req, reply, cc, o...)
			}), grpc.WithStreamInterceptor(
			func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, o ...grpc.CallOption) (grpc.ClientStream, error) {
				return streamer(metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+token), desc, cc, method, o...)
			}))
	}
	if list := strings.TrimPrefix(target, "ipv4:"); strings.Contains(list, ",") {
		// Several addresses (the replicas of a headless Service): a manual resolver, round robin.
		r := manual.NewBuilderWithScheme("replicas")
		var addresses []resolver.Address
		for _, a := range strings.Split(list, ",") {
			addresses = append(addresses, resolver.Address{Addr: a})
		}
		r.InitialState(resolver.State{Addresses: addresses})
		opts = append(opts, grpc.WithResolvers(r))
		target = "replicas:///" + env
	}
	conn, err := grpc.NewClient(target, opts...)
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

// dropQueues deletes the scenarios' queues with whatever each left in it, all at once: each
// DeleteQueue waits out the services' queue-state TTL (10 s by default) before it removes the
// broker queues, so one after another they would cost that wait per scenario.
func dropQueues(t *testing.T, c clients, queues []string) {
	var wg sync.WaitGroup
	for _, queue := range queues {
		wg.Add(1)
		go func(queue string) {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
			defer cancel()
			stream, err := c.admin.DeleteQueue(ctx, &mq.DeleteQueueRequest{Queue: queue, Force: true})
			if err != nil {
				t.Errorf("DeleteQueue %s: %v", queue, err)
				return
			}
			for {
				if _, err := stream.Recv(); err == io.EOF {
					return
				} else if err != nil {
					t.Errorf("DeleteQueue %s: %v", queue, err)
					return
				}
			}
		}(queue)
	}
	wg.Wait()
}

func inline(queue string, mail *mq.Mail, content []byte) *mq.EnqueueRequest {
	return &mq.EnqueueRequest{Queue: queue, Mail: mail, Content: &mq.EnqueueRequest_InlineContent{InlineContent: content}}
}

type step struct {
	Op                 string            `json:"op"`
	Label              string            `json:"label"`
	Mail               json.RawMessage   `json:"mail"`
	Content            string            `json:"content"`
	RandomBytes        int               `json:"random_bytes"`
	Code               *codes.Code       `json:"code"`
	Count              int               `json:"count"`
	Batch              int               `json:"batch"`
	InvalidRecipientAt []int             `json:"invalid_recipient_at"`
	Labels             []string          `json:"labels"`
	Fields             map[string]string `json:"fields"`
	Expect             int64             `json:"expect"`
	Prefetch           uint32            `json:"prefetch"`
	MaxBatch           uint32            `json:"max_batch"`
	Deliveries         int               `json:"deliveries"`
	NotInline          []string          `json:"not_inline"`
	Sender             string            `json:"sender"`
	Deleted            int64             `json:"deleted"`
	PageSize           int32             `json:"page_size"`
	MailsPerS          float64           `json:"mails_per_s"`
	Burst              uint64            `json:"burst"`
	Pages              int               `json:"pages"`
}

type scenario struct {
	Name  string `json:"name"`
	Steps []step `json:"steps"`
}

func TestScenarios(t *testing.T) {
	raw, err := os.ReadFile("../scenarios.json")
	if err != nil {
		t.Fatalf("read scenarios: %v", err)
	}
	var file struct{ Scenarios []scenario }
	if err := json.Unmarshal(raw, &file); err != nil {
		t.Fatalf("parse scenarios: %v", err)
	}
	var queues []string // the subtests run one after another: no lock
	c := connect(t)
	t.Cleanup(func() { dropQueues(t, c, queues) })
	for _, sc := range file.Scenarios {
		sc := sc
		t.Run(sc.Name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			r := &runner{t: t, ctx: ctx, c: connect(t), ids: map[string]string{}}
			r.queue = newQueue(t, ctx, r.c)
			queues = append(queues, r.queue)
			for i, s := range sc.Steps {
				r.step = fmt.Sprintf("step %d (%s)", i, s.Op)
				r.run(s)
			}
		})
	}
}

type runner struct {
	t     *testing.T
	ctx   context.Context
	c     clients
	queue string
	ids   map[string]string
	step  string
}

func (r *runner) fail(format string, args ...any) {
	r.t.Helper()
	r.t.Fatalf(r.step+": "+format, args...)
}

func (r *runner) mail(raw json.RawMessage) *mq.Mail {
	m := &mq.Mail{}
	if err := protojson.Unmarshal(raw, m); err != nil {
		r.fail("mail %s: %v", raw, err)
	}
	return m
}

func (r *runner) run(s step) {
	switch s.Op {
	case "enqueue":
		content := []byte(s.Content)
		if s.RandomBytes > 0 {
			content = randomBytes(s.RandomBytes)
		}
		resp, err := r.c.enqueue.Enqueue(r.ctx, inline(r.queue, r.mail(s.Mail), content))
		want := codes.OK
		if s.Code != nil {
			want = *s.Code
		}
		if status.Code(err) != want {
			r.fail("got %v, want %v", err, want)
		}
		if err == nil && s.Label != "" {
			r.ids[s.Label] = resp.Receipt.EnqueueId
		}
	case "enqueue_stream":
		big := randomBytes(s.RandomBytes)
		stream, err := r.c.enqueue.EnqueueStream(r.ctx)
		if err != nil {
			r.fail("%v", err)
		}
		stream.Send(&mq.EnqueueStreamRequest{Part: &mq.EnqueueStreamRequest_Header{Header: &mq.EnqueueHeader{Queue: r.queue, Mail: r.mail(s.Mail)}}})
		for i := 0; i < len(big); i += 1 << 20 {
			stream.Send(&mq.EnqueueStreamRequest{Part: &mq.EnqueueStreamRequest_Chunk{Chunk: big[i:min(i+1<<20, len(big))]}})
		}
		resp, err := stream.CloseAndRecv()
		if err != nil || resp.Receipt.Size != int64(len(big)) {
			r.fail("%v %v", resp, err)
		}
		r.ids[s.Label] = resp.Receipt.EnqueueId
	case "enqueue_many":
		r.enqueueMany(s)
	case "enqueue_batches":
		r.enqueueBatches(s)
	case "browse":
		r.browse(s)
	case "browse_pages":
		r.browsePages(s)
	case "size":
		size, err := r.c.browse.GetSize(r.ctx, &mq.GetSizeRequest{Queue: r.queue, Exact: true})
		if err != nil || size.Size != s.Expect {
			r.fail("GetSize = %v, %v; want %d", size, err, s.Expect)
		}
	case "dequeue":
		r.dequeue(s)
	case "dequeue_batch":
		r.dequeueBatch(s)
	case "delete_by_sender":
		r.deleteBySender(s)
	case "quota_refusal":
		r.quotaRefusal(s)
	default:
		r.fail("unknown op")
	}
}

func (r *runner) enqueueMany(s step) {
	stream, err := r.c.enqueue.EnqueueMany(r.ctx)
	if err != nil {
		r.fail("%v", err)
	}
	bad := map[uint64]bool{}
	for _, i := range s.InvalidRecipientAt {
		bad[uint64(i)] = true
	}
	for i := uint64(0); i < uint64(s.Count); i++ {
		mail := &mq.Mail{Name: "many", Recipients: []string{"r@example.org"}}
		if bad[i] {
			mail.Recipients = []string{"not an address"}
		}
		if err := stream.Send(&mq.EnqueueManyRequest{Sequence: i, Request: inline(r.queue, mail, []byte("x"))}); err != nil {
			r.fail("send: %v", err)
		}
	}
	stream.CloseSend()
	receipts, refused := 0, map[uint64]int32{}
	receiveAll(r, stream.Recv, func(resp *mq.EnqueueManyResponse) {
		if resp.GetReceipt() != nil {
			receipts++
		} else {
			refused[resp.Sequence] = resp.GetError().Code
		}
	})
	if receipts != s.Count-len(bad) || len(refused) != len(bad) {
		r.fail("%d receipts, refused %v; want %d receipts and %v refused", receipts, refused, s.Count-len(bad), s.InvalidRecipientAt)
	}
	for i := range bad {
		if refused[i] != int32(codes.InvalidArgument) {
			r.fail("mail %d: code %d, want INVALID_ARGUMENT", i, refused[i])
		}
	}
}

// browseIDs lists the enqueue ids of one Browse call, and the next page's token: the value of
// the last message read (only a page's last message carries one).
func (r *runner) browseIDs(request *mq.BrowseRequest) ([]string, string) {
	stream, err := r.c.browse.Browse(r.ctx, request)
	if err != nil {
		r.fail("%v", err)
	}
	var ids []string
	token := ""
	for {
		resp, err := stream.Recv()
		if err == io.EOF {
			return ids, token
		}
		if err != nil {
			r.fail("%v", err)
		}
		ids = append(ids, resp.GetMail().GetEnqueueId())
		token = resp.GetNextPageToken()
	}
}

func (r *runner) browsePages(s step) {
	all, _ := r.browseIDs(&mq.BrowseRequest{Queue: r.queue})
	var paged []string
	token, pages := "", 0
	for {
		ids, next := r.browseIDs(&mq.BrowseRequest{Queue: r.queue, PageSize: s.PageSize, PageToken: token})
		paged, pages = append(paged, ids...), pages+1
		if next == "" {
			break
		}
		token = next
	}
	if len(all) != s.Count || strings.Join(paged, ",") != strings.Join(all, ",") || pages != s.Pages {
		r.fail("%d pages of %v, want %d pages of the unpaged %v (%d mails)", pages, paged, s.Pages, all, s.Count)
	}
}

func (r *runner) browse(s step) {
	stream, err := r.c.browse.Browse(r.ctx, &mq.BrowseRequest{Queue: r.queue})
	if err != nil {
		r.fail("%v", err)
	}
	var listed []any
	var ids []string
	for {
		resp, err := stream.Recv()
		if err == io.EOF {
			break
		}
		if err != nil {
			r.fail("%v", err)
		}
		ids = append(ids, resp.Mail.EnqueueId)
		doc, _ := protojson.MarshalOptions{UseProtoNames: true, EmitUnpopulated: true}.Marshal(resp.Mail)
		var v any
		json.Unmarshal(doc, &v)
		listed = append(listed, v)
	}
	var want []string
	for _, l := range s.Labels {
		want = append(want, r.ids[l])
	}
	if strings.Join(ids, ",") != strings.Join(want, ",") {
		r.fail("browse order %v, want %v (%v)", ids, want, s.Labels)
	}
	for path, value := range s.Fields {
		var at any = listed
		for _, key := range strings.Split(path, ".") {
			switch node := at.(type) {
			case []any:
				i, _ := strconv.Atoi(key)
				if i >= len(node) {
					r.fail("%s: no item %d", path, i)
				}
				at = node[i]
			case map[string]any:
				at = node[key]
			default:
				r.fail("%s: cannot index %v", path, at)
			}
		}
		if fmt.Sprint(at) != value {
			r.fail("%s = %v, want %q", path, at, value)
		}
	}
}

func (r *runner) dequeue(s step) {
	notInline := map[string]bool{}
	for _, n := range s.NotInline {
		notInline[n] = true
	}
	dq, err := r.c.dequeue.Dequeue(r.ctx)
	if err != nil {
		r.fail("%v", err)
	}
	dq.Send(&mq.DequeueRequest{Kind: &mq.DequeueRequest_Subscribe{Subscribe: &mq.Subscribe{Queue: r.queue, Prefetch: s.Prefetch}}})
	retried, deliveries := "", 0
	for deliveries < s.Deliveries {
		resp, err := dq.Recv()
		if err != nil {
			r.fail("recv: %v", err)
		}
		d := resp.GetDelivery()
		if d == nil {
			continue
		}
		deliveries++
		kind := mq.OutcomeKind_OUTCOME_KIND_SUCCESS
		if retried == "" {
			retried, kind = d.Mail.EnqueueId, mq.OutcomeKind_OUTCOME_KIND_RETRY
		} else if d.Mail.EnqueueId == retried && (!d.Redelivered || d.Mail.Attempts != 1) {
			r.fail("a retried mail must come back marked redelivered with 1 attempt: %v", d)
		}
		if notInline[d.Mail.Mail.Name] == d.ContentInline {
			r.fail("content_inline of %s is %v", d.Mail.Mail.Name, d.ContentInline)
		}
		outcome := &mq.Outcome{DeliveryTag: d.DeliveryTag, Kind: kind}
		if kind == mq.OutcomeKind_OUTCOME_KIND_RETRY {
			outcome.RetryAfter = durationpb.New(0) // at once, not after the queue's backoff
		}
		dq.Send(&mq.DequeueRequest{Kind: &mq.DequeueRequest_Outcome{Outcome: outcome}})
	}
	r.closeAndDrain(dq)
}

// closeAndDrain half-closes a Dequeue stream and reads it to its end (the server then ends it).
func (r *runner) closeAndDrain(dq mq.DequeueService_DequeueClient) {
	dq.CloseSend()
	receiveAll(r, dq.Recv, func(*mq.DequeueResponse) {})
}

// receiveAll reads a server stream to its end, handing each message to each.
func receiveAll[T any](r *runner, recv func() (*T, error), each func(*T)) {
	for {
		m, err := recv()
		if err == io.EOF {
			return
		}
		if err != nil {
			r.fail("recv: %v", err)
		}
		each(m)
	}
}

// enqueueBatches sends count mails, batch per EnqueueBatchesRequest message, and counts the answers.
func (r *runner) enqueueBatches(s step) {
	stream, err := r.c.enqueue.EnqueueBatches(r.ctx)
	if err != nil {
		r.fail("%v", err)
	}
	for i := 0; i < s.Count; i += s.Batch {
		batch := &mq.EnqueueBatchesRequest{}
		for j := i; j < min(i+s.Batch, s.Count); j++ {
			batch.Mails = append(batch.Mails, &mq.EnqueueManyRequest{Sequence: uint64(j), Request: inline(r.queue, &mq.Mail{Name: "batch", Recipients: []string{"r@example.org"}}, []byte("x"))})
		}
		if err := stream.Send(batch); err != nil {
			r.fail("send: %v", err)
		}
	}
	stream.CloseSend()
	answered := map[uint64]bool{}
	receiveAll(r, stream.Recv, func(resp *mq.EnqueueBatchesResponse) {
		for _, a := range resp.Results {
			if a.GetReceipt() == nil || answered[a.Sequence] {
				r.fail("answer %v", a)
			}
			answered[a.Sequence] = true
		}
	})
	if len(answered) != s.Count {
		r.fail("%d mails answered, want %d", len(answered), s.Count)
	}
}

// dequeueBatch answers each Deliveries message with one Outcomes message (all SUCCESS).
func (r *runner) dequeueBatch(s step) {
	dq, err := r.c.dequeue.Dequeue(r.ctx)
	if err != nil {
		r.fail("%v", err)
	}
	dq.Send(&mq.DequeueRequest{Kind: &mq.DequeueRequest_Subscribe{Subscribe: &mq.Subscribe{Queue: r.queue, Prefetch: s.Prefetch, MaxBatch: s.MaxBatch}}})
	deliveries := 0
	for deliveries < s.Deliveries {
		resp, err := dq.Recv()
		if err != nil {
			r.fail("recv: %v", err)
		}
		if resp.GetSubscribed() != nil {
			continue
		}
		batch := resp.GetDeliveries().GetDeliveries()
		if len(batch) < 1 || uint32(len(batch)) > s.MaxBatch {
			r.fail("a Deliveries message with %d deliveries (max_batch %d): %v", len(batch), s.MaxBatch, resp)
		}
		outcomes := &mq.Outcomes{}
		for _, d := range batch {
			outcomes.Outcomes = append(outcomes.Outcomes, &mq.Outcome{DeliveryTag: d.DeliveryTag, Kind: mq.OutcomeKind_OUTCOME_KIND_SUCCESS})
		}
		deliveries += len(batch)
		dq.Send(&mq.DequeueRequest{Kind: &mq.DequeueRequest_Outcomes{Outcomes: outcomes}})
	}
	r.closeAndDrain(dq)
	if deliveries != s.Deliveries {
		r.fail("%d deliveries, want %d", deliveries, s.Deliveries)
	}
}

func (r *runner) deleteBySender(s step) {
	del, err := r.c.admin.DeleteMails(r.ctx, &mq.DeleteMailsRequest{Queue: r.queue, Condition: &mq.DeleteMailsRequest_Sender{Sender: s.Sender}})
	if err != nil {
		r.fail("%v", err)
	}
	var last *mq.DeleteProgress
	for {
		resp, err := del.Recv()
		if err == io.EOF {
			break
		}
		if err != nil {
			r.fail("%v", err)
		}
		last = resp.Progress
	}
	if last == nil || !last.Done || last.Deleted != s.Deleted {
		r.fail("final progress %v, want done with %d deleted", last, s.Deleted)
	}
}

// quotaRefusal sets a quota on the scenario's queue (mails_per_s, burst), enqueues until one is
// refused RESOURCE_EXHAUSTED (the quota reaches the replica within about a second), and decodes
// the status's google.rpc details with the stock errdetails types: a RetryInfo with a delay, a
// QuotaFailure naming "queue:<queue>". The quota is cleared after.
func (r *runner) quotaRefusal(s step) {
	perS := s.MailsPerS
	quota := &mq.Quota{Kind: mq.QuotaKind_QUOTA_KIND_QUEUE, Subject: r.queue, MailsPerS: &perS, BurstMails: s.Burst}
	if _, err := r.c.admin.SetQuota(r.ctx, &mq.SetQuotaRequest{Quota: quota}); err != nil {
		r.fail("SetQuota: %v", err)
	}
	defer r.c.admin.ClearQuota(r.ctx, &mq.ClearQuotaRequest{Kind: mq.QuotaKind_QUOTA_KIND_QUEUE, Subject: r.queue})
	mail := &mq.Mail{Name: "quota", Sender: "q@example.com", Recipients: []string{"r@example.org"}}
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, err := r.c.enqueue.Enqueue(r.ctx, inline(r.queue, mail, []byte("Subject: q\r\n\r\nq")))
		if status.Code(err) == codes.ResourceExhausted {
			var retry *errdetails.RetryInfo
			var failure *errdetails.QuotaFailure
			for _, d := range status.Convert(err).Details() {
				switch v := d.(type) {
				case *errdetails.RetryInfo:
					retry = v
				case *errdetails.QuotaFailure:
					failure = v
				}
			}
			if retry == nil || retry.RetryDelay.AsDuration() <= 0 {
				r.fail("no RetryInfo with a delay in %v", status.Convert(err).Details())
			}
			if failure == nil || len(failure.Violations) != 1 || failure.Violations[0].Subject != "queue:"+r.queue {
				r.fail("no QuotaFailure naming queue:%s in %v", r.queue, status.Convert(err).Details())
			}
			return
		}
		if err != nil {
			r.fail("Enqueue: %v", err)
		}
		if time.Now().After(deadline) {
			r.fail("no RESOURCE_EXHAUSTED within 10 s of SetQuota")
		}
	}
}
