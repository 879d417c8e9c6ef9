// Command produce sends rankstream score events with franz-go: one event for one
// board, then one gift that counts on three boards as one message (an array).
//
//	BOOTSTRAP=127.0.0.1:9092 TOPIC=update_rank go run . room42
//
// A secured cluster: TLS_CA (the authority's PEM file: TLS), SASL_MECHANISM (SCRAM-SHA-512,
// SCRAM-SHA-256 or PLAIN), SASL_USERNAME and SASL_PASSWORD.
//
// The event's fields: docs/contract.md §2; how to produce well: docs/producing.md.
package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"log"
	"os"
	"strings"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl"
	"github.com/twmb/franz-go/pkg/sasl/plain"
	"github.com/twmb/franz-go/pkg/sasl/scram"
)

// Event is one score update. Left out here: "op" (default "incr") and "ts" (default: the
// message's timestamp, the send time).
type Event struct {
	ID     string            `json:"id"`     // unique per board for the thing it counts
	Board  string            `json:"board"`  // "<type>:<scope>", here boards of type gift
	Member string            `json:"member"` // who gets the score
	Score  int64             `json:"score"`  // added to the member's score (op incr)
	Meta   map[string]string `json:"meta,omitempty"`
}

func main() {
	room := "room42"
	if len(os.Args) > 1 {
		room = os.Args[1]
	}
	topic := getenv("TOPIC", "update_rank")

	opts := []kgo.Opt{
		kgo.SeedBrokers(strings.Split(getenv("BOOTSTRAP", "127.0.0.1:9092"), ",")...),
		kgo.DefaultProduceTopic(topic),
		// franz-go's producer is idempotent unless you pass kgo.DisableIdempotentWrite():
		// the broker drops the duplicates of its retries. Idempotence needs acks=all (the
		// default too); NewClient refuses anything else, so it is spelled out here.
		kgo.RequiredAcks(kgo.AllISRAcks()),
	}
	client, err := kgo.NewClient(append(opts, security()...)...)
	if err != nil {
		log.Fatalf("kafka client: %v", err)
	}
	defer client.Close()
	// What is in effect, read back from the client.
	idempotent := !client.OptValue(kgo.DisableIdempotentWrite).(bool)
	acks := "all"
	if client.OptValue(kgo.RequiredAcks) != kgo.AllISRAcks() {
		acks = "not all"
	}
	fmt.Printf("producer: enable.idempotence=%t acks=%s\n", idempotent, acks)

	// Ids name the thing counted (an order, a gift's transaction): here one per run.
	run := time.Now().UnixMilli()
	board := "gift:" + room

	// (a) One event: alice received a gift worth 50 in the room.
	single := Event{ID: fmt.Sprintf("order-%d", run), Board: board, Member: "alice", Score: 50,
		Meta: map[string]string{"name": "Alice"}}

	// (b) One gift that counts on the room, its zone and a global board: one message, an
	// array with one event per board. The same id on each is right: ids are per board. (A
	// service names its real zone and global boards, gift:zone-eu, gift:global; here they are
	// named after the room, so that every run has boards of its own.)
	gift := fmt.Sprintf("gift-%d", run)
	var batch []Event
	for _, b := range []string{board, board + "-zone", board + "-global"} {
		batch = append(batch, Event{ID: gift, Board: b, Member: "bob", Score: 10,
			Meta: map[string]string{"name": "Bob"}})
	}

	ctx := context.Background()
	var failed atomic.Bool
	// The key is the board (for an array: its first board): one board's events stay in order.
	for _, value := range []any{single, batch} {
		body, err := json.Marshal(value)
		if err != nil {
			log.Fatalf("json: %v", err)
		}
		record := &kgo.Record{Key: []byte(board), Value: body}
		client.Produce(ctx, record, func(r *kgo.Record, err error) {
			if err != nil {
				failed.Store(true)
				log.Printf("not sent (%s): %v", r.Key, err)
				return
			}
			fmt.Printf("sent %s to %s[%d]@%d\n", r.Key, r.Topic, r.Partition, r.Offset)
		})
	}
	// Produce is asynchronous: wait for every record's answer before exiting.
	if err := client.Flush(ctx); err != nil {
		log.Fatalf("flush: %v", err)
	}
	if failed.Load() {
		os.Exit(1)
	}
}

// security gives the login and TLS options the environment asks for (none: plain TCP).
func security() []kgo.Opt {
	var opts []kgo.Opt
	if ca := os.Getenv("TLS_CA"); ca != "" {
		pem, err := os.ReadFile(ca)
		if err != nil {
			log.Fatalf("TLS_CA: %v", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			log.Fatalf("TLS_CA: no certificate in %s", ca)
		}
		opts = append(opts, kgo.DialTLSConfig(&tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}))
	}
	user, pass := os.Getenv("SASL_USERNAME"), os.Getenv("SASL_PASSWORD")
	var mechanism sasl.Mechanism
	switch os.Getenv("SASL_MECHANISM") {
	case "":
		return opts
	case "SCRAM-SHA-512":
		mechanism = scram.Auth{User: user, Pass: pass}.AsSha512Mechanism()
	case "SCRAM-SHA-256":
		mechanism = scram.Auth{User: user, Pass: pass}.AsSha256Mechanism()
	case "PLAIN":
		mechanism = plain.Auth{User: user, Pass: pass}.AsMechanism()
	default:
		log.Fatalf("SASL_MECHANISM: %q is not SCRAM-SHA-512, SCRAM-SHA-256 or PLAIN", os.Getenv("SASL_MECHANISM"))
	}
	return append(opts, kgo.SASL(mechanism))
}

func getenv(name, fallback string) string {
	if value := os.Getenv(name); value != "" {
		return value
	}
	return fallback
}
