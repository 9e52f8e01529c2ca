// Reference franz-go client for epochguard's tests: one kgo.Client consuming one partition,
// driven over stdin, reporting what it sees as JSON lines on stdout. It holds no opinion of its
// own; tests record what franz-go does around a truncation (ErrDataLoss, resets, re-reads).
//
// Usage: franzgo-probe -bootstrap HOST:PORT[,...] -topic T [-partition P] [-group G] [-start N|committed]
//
// The partition is assigned directly (kgo.ConsumePartitions), as the other reference clients
// assign theirs, with kgo.NoResetOffset (auto.offset.reset none). -group names the group that
// "commit" writes to (an admin commit, generation -1, as an assigned consumer commits) and
// that -start committed restores from: the committed offset with its leader epoch, which
// franz-go validates with OffsetForLeaderEpoch before fetching.
//
// Commands (one per line):
//
//	poll <max_records> <timeout_ms>   poll until max_records arrived or the timeout
//	commit                            commit the position (offset and epoch of the last record)
//	quit
//
// Errors franz-go hands the application while polling are "data_loss" (ErrDataLoss) and
// "fetch_error" events, never terminal: polling goes on, as an application's loop would.
// Every command answers with exactly one terminal event ("polled", "committed", "closed" or
// "error"), so a driver can read until it sees one.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
)

type event map[string]any

var out = json.NewEncoder(os.Stdout)

func emit(e event) {
	if err := out.Encode(e); err != nil {
		fmt.Fprintln(os.Stderr, "cannot write an event:", err)
		os.Exit(3)
	}
}

func fail(kind string, err error) {
	emit(event{"event": "error", "type": kind, "message": err.Error()})
}

// errorEvent says what franz-go handed the application for the partition.
func errorEvent(err error) event {
	var loss *kgo.ErrDataLoss
	if errors.As(err, &loss) {
		return event{
			"event":             "data_loss",
			"consumed_to":       loss.ConsumedTo,
			"consumed_to_epoch": loss.ConsumedToEpoch,
			"reset_to":          loss.ResetTo,
			"reset_to_epoch":    loss.ResetToEpoch,
			"text":              err.Error(),
		}
	}
	code := fmt.Sprintf("%T", err)
	var kafkaErr *kerr.Error
	if errors.As(err, &kafkaErr) {
		code = kafkaErr.Message
	}
	return event{"event": "fetch_error", "code": code, "text": err.Error()}
}

type probe struct {
	client *kgo.Client
	admin  *kadm.Client
	topic  string
	part   int32
	group  string
	// The position an application would commit: one past the last record, with its epoch.
	next      int64
	nextEpoch int32
	expected  int64
}

func (p *probe) poll(max int, timeout time.Duration) {
	deadline := time.Now().Add(timeout)
	count := 0
	// franz-go hands a partition's error back on every poll until it changes: each distinct
	// error is reported once, how often it came in the terminal event.
	repeated := map[string]int{}
	for count < max && time.Now().Before(deadline) {
		ctx, cancel := context.WithDeadline(context.Background(), deadline)
		fetches := p.client.PollRecords(ctx, max-count)
		cancel()
		fetches.EachError(func(_ string, _ int32, err error) {
			if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
				return
			}
			if repeated[err.Error()]++; repeated[err.Error()] == 1 {
				emit(errorEvent(err))
			}
		})
		if fetches.NumRecords() == 0 && time.Now().Before(deadline) {
			// Only errors, which the next poll hands back at once: pause as an application's
			// loop would rather than spin.
			time.Sleep(50 * time.Millisecond)
		}
		fetches.EachRecord(func(r *kgo.Record) {
			if p.expected >= 0 && r.Offset != p.expected {
				// franz-go moved its position by itself (a data-loss reset, say).
				emit(event{"event": "position_jump", "from": p.expected, "to": r.Offset})
			}
			emit(event{
				"event":        "record",
				"offset":       r.Offset,
				"leader_epoch": r.LeaderEpoch,
				"value":        string(r.Value),
			})
			p.expected = r.Offset + 1
			p.next, p.nextEpoch = r.Offset+1, r.LeaderEpoch
			count++
		})
	}
	outcome := "timeout"
	if count >= max {
		outcome = "enough"
	}
	emit(event{"event": "polled", "count": count, "outcome": outcome, "errors_seen": repeated})
}

func (p *probe) commit() {
	if p.group == "" {
		emit(event{"event": "error", "type": "NoGroup", "message": "commit needs -group"})
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	offsets := kadm.Offsets{}
	offsets.Add(kadm.Offset{Topic: p.topic, Partition: p.part, At: p.next, LeaderEpoch: p.nextEpoch})
	committed, err := p.admin.CommitOffsets(ctx, p.group, offsets)
	if err == nil {
		err = committed.Error()
	}
	if err != nil {
		fail("CommitFailed", err)
		return
	}
	at, epoch, err := p.committedOffset(ctx)
	if err != nil {
		fail("OffsetFetchFailed", err)
		return
	}
	emit(event{"event": "committed", "offset": at, "leader_epoch": epoch})
}

func (p *probe) committedOffset(ctx context.Context) (int64, int32, error) {
	fetched, err := p.admin.FetchOffsets(ctx, p.group)
	if err == nil {
		err = fetched.Error()
	}
	if err != nil {
		return 0, 0, err
	}
	o, ok := fetched.Lookup(p.topic, p.part)
	if !ok {
		return 0, 0, fmt.Errorf("group %s has no commit for %s[%d]", p.group, p.topic, p.part)
	}
	return o.At, o.LeaderEpoch, nil
}

func main() {
	bootstrap := flag.String("bootstrap", "", "comma-separated host:port list")
	topic := flag.String("topic", "", "topic to consume")
	partition := flag.Int("partition", 0, "partition to consume")
	group := flag.String("group", "", "group to commit to and restore from")
	start := flag.String("start", "0", "offset to start at, or 'committed'")
	flag.Parse()
	if *bootstrap == "" || *topic == "" {
		flag.Usage()
		os.Exit(2)
	}
	seeds := strings.Split(*bootstrap, ",")
	p := &probe{topic: *topic, part: int32(*partition), group: *group, expected: -1}

	admin, err := kgo.NewClient(kgo.SeedBrokers(seeds...), kgo.MetadataMinAge(100*time.Millisecond))
	if err != nil {
		fail("ClientFailed", err)
		os.Exit(1)
	}
	defer admin.Close()
	p.admin = kadm.NewClient(admin)

	var at kgo.Offset
	if *start == "committed" {
		// A seed broker may be down (the scenario stopped it): kadm gives up on the first
		// refused connection, so ask again, as a restarting application would.
		var offset int64
		var epoch int32
		var err error
		for deadline := time.Now().Add(20 * time.Second); ; {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			offset, epoch, err = p.committedOffset(ctx)
			cancel()
			if err == nil || time.Now().After(deadline) {
				break
			}
			fmt.Fprintln(os.Stderr, "fetching the committed offset again after:", err)
			time.Sleep(200 * time.Millisecond)
		}
		if err != nil {
			fail("OffsetFetchFailed", err)
			os.Exit(1)
		}
		at = kgo.NewOffset().At(offset).WithEpoch(epoch)
		p.next, p.nextEpoch = offset, epoch
	} else {
		offset, err := strconv.ParseInt(*start, 10, 64)
		if err != nil {
			fail("BadStart", err)
			os.Exit(2)
		}
		at = kgo.NewOffset().At(offset)
		p.next, p.nextEpoch = offset, -1
	}

	p.client, err = kgo.NewClient(
		kgo.SeedBrokers(seeds...),
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{*topic: {p.part: at}}),
		kgo.ConsumeResetOffset(kgo.NoResetOffset()),
		// Reactions inside a test's time budget, as the other reference clients are set.
		kgo.MetadataMaxAge(time.Second),
		kgo.MetadataMinAge(100*time.Millisecond),
		kgo.FetchMaxWait(500*time.Millisecond),
		kgo.RetryBackoffFn(func(int) time.Duration { return 200 * time.Millisecond }),
	)
	if err != nil {
		fail("ClientFailed", err)
		os.Exit(1)
	}
	defer p.client.Close()
	emit(event{"event": "ready", "topic": *topic, "partition": *partition, "start": *start})

	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		cmd := strings.Fields(in.Text())
		if len(cmd) == 0 {
			continue
		}
		switch cmd[0] {
		case "poll":
			if len(cmd) != 3 {
				emit(event{"event": "error", "type": "BadCommand", "message": in.Text()})
				continue
			}
			max, err1 := strconv.Atoi(cmd[1])
			ms, err2 := strconv.Atoi(cmd[2])
			if err := errors.Join(err1, err2); err != nil {
				fail("BadCommand", err)
				continue
			}
			p.poll(max, time.Duration(ms)*time.Millisecond)
		case "commit":
			p.commit()
		case "quit":
			emit(event{"event": "closed"})
			return
		default:
			emit(event{"event": "error", "type": "UnknownCommand", "message": in.Text()})
		}
	}
}
