// mqttgen: the benchmark's compiled MQTT 3.1.1 load generator, and a broker-less sink
// that shows how far it can go (bench/README.md, "mqttgen"; driven by bench/cgen.py).
//
//   mqttgen run --host H --port P --publishers N --subscribers M --topology T --qos Q ...
//   mqttgen sink --port 0
//
// Strategy of `run`: every client is connected and subscribed by the main thread with
// blocking sockets before the clock starts, then handed to one of --threads event-loop
// threads (epoll, level-triggered, nonblocking sockets). The main thread only keeps
// time: it snapshots the counters after --warmup and again after --duration, prints an
// event line at each of those instants (so a wrapper can read the broker's own counters
// then), and afterwards collects the results. Counters are written by one thread each
// and read by the main thread with relaxed atomics: a snapshot may be off by one batch,
// against millions of messages counted.
//
// Every payload starts with a CLOCK_MONOTONIC stamp, written when the packet is handed
// to the kernel, then the publisher's number and the message's sequence number: the
// subscribers measure latency from the first and count exactly which acknowledged QoS 1
// messages never arrived from the other two.
//
// Strategy of `sink`: one epoll loop that answers like a broker but does nothing else
// (exact topics, no sessions, no queues beyond a bounded output buffer per connection),
// so the rate the generator reaches against it is the generator's own ceiling.
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/ioctl.h>
#include <sys/random.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/timerfd.h>
#include <time.h>
#include <unistd.h>
#include <linux/sockios.h>

// ---------------------------------------------------------------------------------------
// Utilities

static void die(const char *fmt, ...) __attribute__((noreturn, format(printf, 1, 2)));

// One line on stderr, then exit 1: the wrapper shows that line as the reason.
static void die(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fputs("mqttgen: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    exit(1);
}

static void *xrealloc(void *p, size_t n) {
    p = realloc(p, n);
    if (p == NULL && n != 0)
        die("out of memory (%zu bytes)", n);
    return p;
}

static void *xcalloc(size_t count, size_t size) {
    void *p = calloc(count, size);
    if (p == NULL && count != 0)
        die("out of memory (%zu x %zu bytes)", count, size);
    return p;
}

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void sleep_ns(uint64_t ns) {
    struct timespec ts = {(time_t)(ns / 1000000000u), (long)(ns % 1000000000u)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

static double cpu_seconds(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);  // all threads of the process
    return (double)ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6 + (double)ru.ru_stime.tv_sec +
           ru.ru_stime.tv_usec / 1e6;
}

// A byte buffer: data[start, end) is what is still to parse (input) or to write (output).
struct buf {
    uint8_t *data;
    size_t start, end, cap;
};

static size_t buf_pending(const struct buf *b) { return b->end - b->start; }

// Room for `n` more bytes at the end. Consumed bytes are dropped by moving the rest to
// the front, in steps of `align`: a publisher's buffer holds fixed-size PUBLISHes from
// offset 0, and keeping that lets it find its unsent packets to stamp (pub_stamp).
static uint8_t *buf_room(struct buf *b, size_t n, size_t align) {
    if (b->cap - b->end >= n)
        return b->data + b->end;
    size_t shift = b->start - b->start % align;
    if (shift) {
        memmove(b->data, b->data + shift, b->end - shift);
        b->start -= shift;
        b->end -= shift;
    }
    if (b->cap - b->end < n) {
        size_t cap = b->cap ? b->cap * 2 : 4096;
        while (cap - b->end < n)
            cap *= 2;
        b->data = xrealloc(b->data, cap);
        b->cap = cap;
    }
    return b->data + b->end;
}

static void buf_put(struct buf *b, const void *p, size_t n) {
    memcpy(buf_room(b, n, 1), p, n);
    b->end += n;
}

// After parsing: keep only an incomplete packet, at the front, so reads can be large.
static void buf_compact(struct buf *b) {
    if (b->start == b->end) {
        b->start = b->end = 0;
    } else if (b->start) {
        memmove(b->data, b->data + b->start, b->end - b->start);
        b->end -= b->start;
        b->start = 0;
    }
}

// A growable bit set (sequence numbers seen or acknowledged).
struct bits {
    uint64_t *words;
    size_t nwords;
};

static void bits_set(struct bits *s, uint32_t i) {
    size_t w = i / 64;
    if (w >= s->nwords) {
        size_t n = s->nwords ? s->nwords * 2 : 1024;
        while (n <= w)
            n *= 2;
        s->words = xrealloc(s->words, n * sizeof *s->words);
        memset(s->words + s->nwords, 0, (n - s->nwords) * sizeof *s->words);
        s->nwords = n;
    }
    s->words[w] |= (uint64_t)1 << (i % 64);
}

static uint64_t bits_word(const struct bits *s, size_t w) { return w < s->nwords ? s->words[w] : 0; }

// Counters have one writer (an event-loop thread) and are read by the main thread.
typedef _Atomic uint64_t counter_t;

static void bump(counter_t *c, uint64_t n) {
    atomic_store_explicit(c, atomic_load_explicit(c, memory_order_relaxed) + n,
                          memory_order_relaxed);
}

static uint64_t peek(counter_t *c) { return atomic_load_explicit(c, memory_order_relaxed); }

static void set_nonblocking_nodelay(int fd) {
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    int flags = fcntl(fd, F_GETFL);
    fcntl(fd, F_SETFL, flags | O_NONBLOCK);
}

// ---------------------------------------------------------------------------------------
// MQTT 3.1.1 framing and encoding

enum {
    CONNECT = 1, CONNACK, PUBLISH, PUBACK, PUBREC, PUBREL, PUBCOMP, SUBSCRIBE, SUBACK,
    UNSUBSCRIBE, UNSUBACK, PINGREQ, PINGRESP, DISCONNECT
};

#define MAX_PACKET_ID 65535u
#define STAMP_BYTES 8   // payload: CLOCK_MONOTONIC ns at send time,
#define TRACE_BYTES 16  // then publisher number and sequence number (uint32 each)

struct frame {
    unsigned type, flags;
    const uint8_t *body;
    size_t len;   // of the body (the remaining length)
    size_t size;  // of the whole packet
};

// 1: a whole packet at p; 0: more bytes needed; -1: malformed remaining length.
static int parse_frame(const uint8_t *p, size_t n, struct frame *f) {
    size_t len = 0, i = 1;
    for (unsigned shift = 0;; shift += 7) {
        if (shift > 21)
            return -1;
        if (i >= n)
            return 0;
        uint8_t b = p[i++];
        len |= (size_t)(b & 0x7f) << shift;
        if (!(b & 0x80))
            break;
    }
    if (n - i < len)
        return 0;
    f->type = p[0] >> 4;
    f->flags = p[0] & 0x0f;
    f->body = p + i;
    f->len = len;
    f->size = i + len;
    return 1;
}

static size_t put_varint(uint8_t *p, size_t v) {
    size_t i = 0;
    do {
        p[i] = v & 0x7f;
        v >>= 7;
        if (v)
            p[i] |= 0x80;
        i++;
    } while (v);
    return i;
}

static size_t put_u16(uint8_t *p, unsigned v) {
    p[0] = (uint8_t)(v >> 8);
    p[1] = (uint8_t)v;
    return 2;
}

static size_t put_str(uint8_t *p, const char *s, size_t n) {
    put_u16(p, (unsigned)n);
    memcpy(p + 2, s, n);
    return 2 + n;
}

static unsigned get_u16(const uint8_t *p) { return (unsigned)p[0] << 8 | p[1]; }

static void put_ack(struct buf *b, unsigned type, unsigned flags, unsigned packet_id) {
    uint8_t p[4] = {(uint8_t)(type << 4 | flags), 2};
    put_u16(p + 2, packet_id);
    buf_put(b, p, 4);
}

// A PUBLISH: fixed header, topic, packet id (QoS > 0), payload. Returns its size.
static size_t encode_publish(uint8_t *p, const char *topic, size_t topic_len,
                             const uint8_t *payload, size_t payload_len, unsigned qos,
                             unsigned packet_id) {
    size_t i = 0;
    p[i++] = (uint8_t)(PUBLISH << 4 | qos << 1);
    i += put_varint(p + i, 2 + topic_len + (qos ? 2 : 0) + payload_len);
    i += put_str(p + i, topic, topic_len);
    if (qos)
        i += put_u16(p + i, packet_id);
    memcpy(p + i, payload, payload_len);
    return i + payload_len;
}

static size_t publish_size(size_t topic_len, size_t payload_len, unsigned qos) {
    uint8_t tmp[8];
    size_t rest = 2 + topic_len + (qos ? 2 : 0) + payload_len;
    return 1 + put_varint(tmp, rest) + rest;
}

// Where a PUBLISH's topic, packet id and payload are; false if it is malformed.
struct publish {
    unsigned qos, packet_id;
    const uint8_t *topic, *payload;
    size_t topic_len, payload_len;
};

static bool parse_publish(const struct frame *f, struct publish *m) {
    m->qos = (f->flags >> 1) & 3;
    if (f->len < 2)
        return false;
    m->topic_len = get_u16(f->body);
    size_t at = 2 + m->topic_len + (m->qos ? 2 : 0);
    if (at > f->len || m->qos == 3)
        return false;
    m->topic = f->body + 2;
    m->packet_id = m->qos ? get_u16(f->body + 2 + m->topic_len) : 0;
    m->payload = f->body + at;
    m->payload_len = f->len - at;
    return true;
}

// ---------------------------------------------------------------------------------------
// run: the load generator

enum topology { PAIRS, FANOUT, FANIN, SHARED };
enum { FLOOD, PACED };
// What the event-loop threads do, set by the main thread as time passes.
enum phase { LOADING, MEASURING, HOLDING, DRAINING, DONE };

#define IN_BYTES (256 * 1024)     // one read of a subscriber: many deliveries per wake-up
#define BATCH_BYTES (64 * 1024)   // one write of a QoS 0 flood publisher
#define BATCHES_PER_WAKEUP 8      // then other clients of the thread get their turn
#define TICK_NS 1000000u          // paced publishers send what is due every millisecond
#define MAX_BACKLOG_NS 10000000u  // and never catch up more than 10 ms of schedule
#define SETUP_TIMEOUT_S 10        // for each CONNACK and SUBACK
#define MAX_READ_MARK (16 * 1024) // the most a flood's reader waits for (SO_RCVLOWAT)

static struct options {
    const char *host;
    int port;
    int publishers, subscribers;
    enum topology topology;
    unsigned qos;
    size_t payload;
    unsigned window;
    int mode;
    double rate;  // messages per second, all publishers together
    double warmup, duration, settle;
    uint64_t backlog;  // deliveries owed before publishers wait; 0: no bound
    bool persistent, hold;
    bool bulk_reads;  // paced: read marks as in a flood (a throughput row, not latency)
    int threads;
    const char *id_prefix;
    const char *username, *password;  // NULL: a CONNECT without them
    const char *sub_host;  // --sub-host/--sub-port: subscribers on another broker (a bridge's)
    int sub_port;
    long read_mark;  // subscribers' SO_RCVLOWAT; < 0: automatic (read_mark)
} opt = {
    .host = "127.0.0.1", .port = 1883, .publishers = 1, .subscribers = 1, .qos = 0,
    .payload = 64, .window = 100, .mode = FLOOD, .warmup = 1, .duration = 5, .settle = 1,
    .threads = 1, .id_prefix = "mqttgen", .read_mark = -1,
};

static _Atomic int phase = LOADING;

// The first failure seen by an event-loop thread; the main thread reports it and exits.
static pthread_mutex_t failure_lock = PTHREAD_MUTEX_INITIALIZER;
static char failure[256];
static atomic_bool failed;

static void fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

static void fail(const char *fmt, ...) {
    pthread_mutex_lock(&failure_lock);
    if (!atomic_load(&failed)) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(failure, sizeof failure, fmt, ap);
        va_end(ap);
        atomic_store(&failed, true);
    }
    pthread_mutex_unlock(&failure_lock);
}

enum role { SUBSCRIBER, PUBLISHER };

struct client {
    enum role role;
    int index;  // among the publishers or among the subscribers
    int fd, local_port;
    struct gen_thread *thread;
    struct buf in, out;
    bool out_watched;  // EPOLLOUT registered
    bool waiting;      // publisher paused by the backlog bound, until pub_resume
    int read_mark;     // SO_RCVLOWAT, 1 when unset
    // Publisher: the PUBLISH it sends, with its packet id, stamp and trace to fill in
    // (a subscriber: packet_size is that of the deliveries it gets).
    uint8_t *template;
    size_t packet_size, payload_at;
    size_t batch;  // PUBLISHes per write of a QoS 0 flood
    uint32_t next_seq;
    unsigned next_packet_id, inflight;
    uint32_t *seq_of_id;  // QoS 1: packet id -> sequence number + 1, 0 when free
    struct bits acked;    // QoS 1: sequence numbers PUBACKed
    double credit;        // paced: messages due and not sent yet
    uint64_t last_tick;
    counter_t written;    // bytes of PUBLISHes handed to the kernel
    counter_t pubacks;
    // Subscriber: sequence numbers received, per publisher.
    struct bits *seen;
    counter_t delivered;
};

struct gen_thread {
    pthread_t id;
    int epoll, timer;
    struct client **clients;
    int nclients;
    int nwaiting;  // its publishers paused by the backlog bound
    uint32_t *latency_us;  // deliveries of the measured seconds
    size_t nlatency, latency_cap;
};

static struct client *pubs, *subs;
static struct gen_thread *threads;

// The backlog bound (--backlog), as bench/loadgen.py's Backlog: messages published by
// all publishers (put in their output) and deliveries received by all subscribers. Owed
// is published x subscribers per message - delivered; while at least --backlog are owed,
// publishers wait (QoS 1 ones on top of their window). Counted only with a bound.
static counter_t backlog_published, backlog_delivered;
static uint64_t fanout = 1;  // subscribers receiving each message

// A counter several threads write: an atomic add when there are several threads, one
// thread's plain load and store (bump) when there is one.
static void shared_add(counter_t *c, uint64_t n) {
    if (opt.threads > 1)
        atomic_fetch_add_explicit(c, n, memory_order_relaxed);
    else
        bump(c, n);
}

static bool backlog_full(void) {
    if (!opt.backlog)
        return false;
    uint64_t owed = peek(&backlog_published) * fanout, delivered = peek(&backlog_delivered);
    return owed > delivered && owed - delivered >= opt.backlog;
}

static void watch(struct client *c, bool out) {
    struct epoll_event ev = {.events = EPOLLIN | (out ? EPOLLOUT : 0u), .data.ptr = c};
    if (epoll_ctl(c->thread->epoll, EPOLL_CTL_MOD, c->fd, &ev) != 0)
        die("epoll_ctl: %s", strerror(errno));
    c->out_watched = out;
}

static const char *role_name(const struct client *c) {
    return c->role == PUBLISHER ? "publisher" : "subscriber";
}

// A QoS 0 flood publisher keeps EPOLLOUT on: being writable is its cue to write more.
// One paused by the backlog bound does not, until pub_resume.
static bool floods(const struct client *c) {
    return c->role == PUBLISHER && opt.mode == FLOOD && opt.qos == 0 && !c->waiting &&
           atomic_load_explicit(&phase, memory_order_relaxed) < DRAINING;
}

// Stamp every PUBLISH not yet handed to the kernel (not one partly written) with the
// time now, so a packet that waited in our buffer does not count that wait as latency.
static void pub_stamp(struct client *c) {
    size_t size = c->packet_size;
    size_t first = (c->out.start + size - 1) / size, last = c->out.end / size;
    if (first >= last)
        return;
    uint64_t now = now_ns();
    for (size_t i = first; i < last; i++)
        memcpy(c->out.data + i * size + c->payload_at, &now, sizeof now);
}

// Write what is buffered; watch for EPOLLOUT while the kernel will not take it all.
static bool flush(struct client *c) {
    if (c->role == PUBLISHER)
        pub_stamp(c);
    while (c->out.start < c->out.end) {
        ssize_t n = write(c->fd, c->out.data + c->out.start, buf_pending(&c->out));
        if (n > 0) {
            c->out.start += (size_t)n;
            if (c->role == PUBLISHER)
                bump(&c->written, (uint64_t)n);
        } else if (n < 0 && errno == EINTR) {
            continue;
        } else if (n < 0 && errno == EAGAIN) {
            if (!c->out_watched)
                watch(c, true);
            return true;
        } else {
            fail("%s %d: write: %s", role_name(c), c->index, strerror(errno));
            return false;
        }
    }
    c->out.start = c->out.end = 0;
    if (c->out_watched != floods(c))
        watch(c, floods(c));
    return true;
}

// Append the publisher's next PUBLISH (stamped later, by pub_stamp).
static void pub_enqueue(struct client *c) {
    uint8_t *p = buf_room(&c->out, c->packet_size, c->packet_size);
    memcpy(p, c->template, c->packet_size);
    uint32_t seq = c->next_seq++;
    if (opt.payload >= TRACE_BYTES) {
        uint32_t trace[2] = {(uint32_t)c->index, seq};
        memcpy(p + c->payload_at + STAMP_BYTES, trace, sizeof trace);
    }
    if (opt.qos) {
        unsigned id = c->next_packet_id;
        while (c->seq_of_id[id])  // still in flight from 65,535 packets ago
            id = id % MAX_PACKET_ID + 1;
        c->next_packet_id = id % MAX_PACKET_ID + 1;
        c->seq_of_id[id] = seq + 1;
        c->inflight++;
        put_u16(p + c->payload_at - 2, id);
    }
    c->out.end += c->packet_size;
    if (opt.backlog)
        shared_add(&backlog_published, 1);
}

static bool publishing(void) {
    return atomic_load_explicit(&phase, memory_order_relaxed) < DRAINING;
}

// Bounded: the publisher stops until the thread sees the backlog below its bound
// (pub_resume); a QoS 0 flood stops watching EPOLLOUT meanwhile (floods() is false).
static void pub_wait(struct client *c) {
    c->waiting = true;
    c->thread->nwaiting++;
    if (c->out_watched && buf_pending(&c->out) == 0)
        watch(c, false);
}

// QoS 1 flood: keep the window full (bounded: while the backlog allows).
static void pub_top_up(struct client *c) {
    if (c->waiting)
        return;
    while (c->inflight < opt.window && publishing()) {
        if (backlog_full()) {
            pub_wait(c);
            return;
        }
        pub_enqueue(c);
    }
}

// QoS 0 flood: the socket is writable, so write batches until it is not (bounded: and
// while the backlog allows).
static void pub_flood(struct client *c) {
    for (int i = 0; i < BATCHES_PER_WAKEUP && publishing() && !c->waiting; i++) {
        if (buf_pending(&c->out) == 0) {
            if (backlog_full()) {
                pub_wait(c);
                return;
            }
            for (size_t n = c->batch; n > 0; n--)
                pub_enqueue(c);
        }
        if (!flush(c) || c->out_watched != floods(c) || buf_pending(&c->out))
            return;  // the kernel is full: EPOLLOUT will call again
    }
    flush(c);  // stops watching EPOLLOUT once draining
}

// Paced: send what the schedule says is due since the last tick.
static void pub_tick(struct client *c, uint64_t now) {
    double rate = opt.rate / opt.publishers;
    c->credit += (double)(now - c->last_tick) * rate / 1e9;
    c->last_tick = now;
    double most = rate * MAX_BACKLOG_NS / 1e9;
    if (most < 1)
        most = 1;
    if (c->credit > most)  // a stalled broker gets no burst of the missed schedule
        c->credit = most;
    if (!publishing())
        return;
    unsigned due = (unsigned)c->credit;
    if (backlog_full())  // the schedule's credit waits, up to MAX_BACKLOG_NS of it
        due = 0;
    else if (opt.qos && due > opt.window - c->inflight)
        due = opt.window - c->inflight;
    else if (!opt.qos && buf_pending(&c->out) > BATCH_BYTES)  // the kernel stopped taking them
        due = 0;
    for (unsigned i = 0; i < due; i++)
        pub_enqueue(c);
    c->credit -= due;
    if (due)
        flush(c);
}

static void record_latency(struct gen_thread *t, uint64_t us) {
    if (t->nlatency == t->latency_cap) {
        t->latency_cap *= 2;
        t->latency_us = xrealloc(t->latency_us, t->latency_cap * sizeof *t->latency_us);
    }
    t->latency_us[t->nlatency++] = us > UINT32_MAX ? UINT32_MAX : (uint32_t)us;
}

static void on_delivery(struct client *c, const struct publish *m, uint64_t now, bool measuring) {
    if (m->payload_len >= STAMP_BYTES && measuring) {
        uint64_t stamp;
        memcpy(&stamp, m->payload, sizeof stamp);
        record_latency(c->thread, now > stamp ? (now - stamp) / 1000 : 0);
    }
    if (m->payload_len >= TRACE_BYTES) {
        uint32_t trace[2];
        memcpy(trace, m->payload + STAMP_BYTES, sizeof trace);
        if (trace[0] < (uint32_t)opt.publishers)
            bits_set(&c->seen[trace[0]], trace[1]);
    }
    if (m->qos == 1)
        put_ack(&c->out, PUBACK, 0, m->packet_id);
    else if (m->qos == 2)
        put_ack(&c->out, PUBREC, 0, m->packet_id);
}

static void on_puback(struct client *c, unsigned id) {
    if (c->role != PUBLISHER || !opt.qos || !c->seq_of_id[id])
        return;  // not one of ours
    bits_set(&c->acked, c->seq_of_id[id] - 1);
    c->seq_of_id[id] = 0;
    c->inflight--;
    bump(&c->pubacks, 1);
}

// Handle every whole packet in the input; the acks they call for go out in one write.
static bool process(struct client *c) {
    uint64_t now = now_ns();
    bool measuring = atomic_load_explicit(&phase, memory_order_relaxed) == MEASURING;
    uint64_t deliveries = 0;
    struct frame f;
    int got;
    while ((got = parse_frame(c->in.data + c->in.start, buf_pending(&c->in), &f)) == 1) {
        c->in.start += f.size;
        struct publish m;
        if (f.type == PUBLISH && c->role == SUBSCRIBER && parse_publish(&f, &m)) {
            deliveries++;
            on_delivery(c, &m, now, measuring);
        } else if (f.type == PUBACK && f.len >= 2) {
            on_puback(c, get_u16(f.body));
        } else if (f.type == PUBREL && f.len >= 2) {
            put_ack(&c->out, PUBCOMP, 0, get_u16(f.body));
        }
    }
    if (got < 0) {
        fail("%s %d: malformed packet from the broker", role_name(c), c->index);
        return false;
    }
    if (deliveries) {
        bump(&c->delivered, deliveries);
        if (opt.backlog)
            shared_add(&backlog_delivered, deliveries);
    }
    buf_compact(&c->in);
    if (c->role == PUBLISHER && opt.qos && opt.mode == FLOOD)
        pub_top_up(c);
    else if (c->role == PUBLISHER && opt.qos)  // paced: what is due goes out as the
        pub_tick(c, now);                       // window opens, not at the next tick
    return buf_pending(&c->out) == 0 || flush(c);
}

static bool on_readable(struct client *c) {
    if (c->in.cap - c->in.end == 0) {
        fail("%s %d: a packet larger than %d bytes", role_name(c), c->index, IN_BYTES);
        return false;
    }
    ssize_t n = read(c->fd, c->in.data + c->in.end, c->in.cap - c->in.end);
    if (n > 0) {
        c->in.end += (size_t)n;
        return process(c);
    }
    if (n < 0 && (errno == EAGAIN || errno == EINTR))
        return true;
    fail("%s %d: %s", role_name(c), c->index,
         n == 0 ? "connection closed by the broker" : strerror(errno));
    return false;
}

// Once publishing has stopped, the last packets may be fewer bytes than a read mark:
// read at every byte again, and read what is already there.
static bool drop_read_marks(struct gen_thread *t) {
    int one = 1;
    for (int i = 0; i < t->nclients; i++) {
        struct client *c = t->clients[i];
        if (c->read_mark > 1) {
            setsockopt(c->fd, SOL_SOCKET, SO_RCVLOWAT, &one, sizeof one);
            c->read_mark = 1;
            if (!on_readable(c))
                return false;
        }
    }
    return true;
}

// Bounded: once the backlog is below its bound, the thread's paused publishers go on.
static bool pub_resume(struct gen_thread *t) {
    for (int i = 0; i < t->nclients && t->nwaiting; i++) {
        struct client *c = t->clients[i];
        if (!c->waiting)
            continue;
        c->waiting = false;
        t->nwaiting--;
        if (opt.mode != FLOOD)
            continue;
        if (opt.qos) {
            pub_top_up(c);  // may wait again
            if (buf_pending(&c->out) && !flush(c))
                return false;
        } else if (floods(c) && !c->out_watched) {
            watch(c, true);  // EPOLLOUT calls pub_flood
        }
    }
    return true;
}

static void *gen_loop(void *arg) {
    struct gen_thread *t = arg;
    bool marks_dropped = false;
    uint64_t start = now_ns();
    for (int i = 0; i < t->nclients; i++) {
        struct client *c = t->clients[i];
        c->last_tick = start;
        if (c->role == PUBLISHER && opt.mode == FLOOD && opt.qos)
            process(c);  // fills the window
        else if (floods(c))
            watch(c, true);
    }
    struct epoll_event events[256];
    while (atomic_load_explicit(&phase, memory_order_relaxed) != DONE &&
           !atomic_load_explicit(&failed, memory_order_relaxed)) {
        // 10 ms: phase changes are seen; 1 ms while publishers wait for the backlog, which
        // another thread's subscribers may bring down.
        int n = epoll_wait(t->epoll, events, 256, t->nwaiting ? 1 : 10);
        if (!marks_dropped && !publishing()) {
            marks_dropped = true;
            if (!drop_read_marks(t))
                return NULL;
        }
        if (n < 0 && errno != EINTR)
            die("epoll_wait: %s", strerror(errno));
        for (int i = 0; i < n; i++) {
            struct client *c = events[i].data.ptr;
            if (c == NULL) {  // the pacing timer
                uint64_t expirations;
                if (read(t->timer, &expirations, sizeof expirations) < 0 && errno != EAGAIN)
                    die("timerfd: %s", strerror(errno));
                uint64_t now = now_ns();
                for (int j = 0; j < t->nclients; j++)
                    if (t->clients[j]->role == PUBLISHER)
                        pub_tick(t->clients[j], now);
                continue;
            }
            if (events[i].events & (EPOLLIN | EPOLLERR | EPOLLHUP) && !on_readable(c))
                return NULL;
            if (events[i].events & EPOLLOUT) {
                if (buf_pending(&c->out) == 0 && floods(c))
                    pub_flood(c);
                else if (!flush(c))
                    return NULL;
            }
        }
        if (t->nwaiting && !backlog_full() && !pub_resume(t))
            return NULL;
    }
    return NULL;
}

// ---- setup, by the main thread, with blocking sockets

static struct addrinfo *broker_addr;
static struct addrinfo *sub_addr;  // the subscribers' broker: broker_addr unless --sub-port

static void describe(char *out, size_t n, const struct client *c) {
    bool away = c->role == SUBSCRIBER && opt.sub_port;
    snprintf(out, n, "%s %d (%s:%d)", role_name(c), c->index, away ? opt.sub_host : opt.host,
             away ? opt.sub_port : opt.port);
}

static const char *connack_reason(unsigned code) {
    static const char *reasons[] = {
        "accepted", "unacceptable protocol version", "identifier rejected",
        "server unavailable", "bad user name or password", "not authorized",
    };
    return code < sizeof reasons / sizeof *reasons ? reasons[code] : "unknown return code";
}

// Read until a whole packet is in the client's input; returns it (consumed).
static struct frame await_packet(struct client *c, const char *what) {
    char who[128];
    describe(who, sizeof who, c);
    for (;;) {
        struct frame f;
        int got = parse_frame(c->in.data + c->in.start, buf_pending(&c->in), &f);
        if (got < 0)
            die("%s: malformed packet while waiting for %s", who, what);
        if (got == 1) {
            c->in.start += f.size;
            return f;
        }
        ssize_t n = read(c->fd, c->in.data + c->in.end, c->in.cap - c->in.end);
        if (n > 0) {
            c->in.end += (size_t)n;
        } else if (n == 0) {
            die("%s: connection closed by the broker while waiting for %s", who, what);
        } else if (errno == EAGAIN) {
            die("%s: no %s within %d s", who, what, SETUP_TIMEOUT_S);
        } else if (errno != EINTR) {
            die("%s: %s while waiting for %s", who, strerror(errno), what);
        }
    }
}

static void send_all(struct client *c, const uint8_t *p, size_t n) {
    while (n) {
        ssize_t w = write(c->fd, p, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0) {
            char who[128];
            describe(who, sizeof who, c);
            die("%s: write: %s", who, strerror(errno));
        }
        p += w;
        n -= (size_t)w;
    }
}

static void mqtt_connect(struct client *c, const char *client_id, bool clean) {
    char who[128];
    describe(who, sizeof who, c);
    struct addrinfo *addr = c->role == SUBSCRIBER ? sub_addr : broker_addr;
    c->fd = socket(addr->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (c->fd < 0)
        die("socket: %s", strerror(errno));
    if (connect(c->fd, addr->ai_addr, addr->ai_addrlen) != 0)
        die("%s: connect: %s", who, strerror(errno));
    int one = 1;
    setsockopt(c->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    struct timeval timeout = {SETUP_TIMEOUT_S, 0};
    setsockopt(c->fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout);
    struct sockaddr_storage local;
    socklen_t len = sizeof local;
    getsockname(c->fd, (struct sockaddr *)&local, &len);
    c->local_port = ntohs(local.ss_family == AF_INET6
                              ? ((struct sockaddr_in6 *)&local)->sin6_port
                              : ((struct sockaddr_in *)&local)->sin_port);
    c->in.cap = c->role == SUBSCRIBER ? IN_BYTES : BATCH_BYTES;
    c->in.data = xrealloc(NULL, c->in.cap);

    uint8_t p[1024];
    size_t id_len = strlen(client_id), i = 0;
    size_t user_len = opt.username ? strlen(opt.username) : 0;
    size_t pass_len = opt.password ? strlen(opt.password) : 0;
    size_t credentials = (opt.username ? 2 + user_len : 0) + (opt.password ? 2 + pass_len : 0);
    p[i++] = CONNECT << 4;
    i += put_varint(p + i, 10 + 2 + id_len + credentials);
    i += put_str(p + i, "MQTT", 4);
    p[i++] = 4;  // protocol level: 3.1.1
    p[i++] = (uint8_t)((clean ? 0x02 : 0x00) | (opt.username ? 0x80 : 0) |
                       (opt.password ? 0x40 : 0));  // connect flags
    i += put_u16(p + i, 0);  // keep alive off: no PINGREQ needed while idle
    i += put_str(p + i, client_id, id_len);
    if (opt.username)
        i += put_str(p + i, opt.username, user_len);
    if (opt.password)
        i += put_str(p + i, opt.password, pass_len);
    send_all(c, p, i);
    struct frame f = await_packet(c, "CONNACK");
    if (f.type != CONNACK || f.len < 2)
        die("%s: expected CONNACK, got packet type %u", who, f.type);
    if (f.body[1] != 0)
        die("%s: CONNACK refused: %s (%u)", who, connack_reason(f.body[1]), f.body[1]);
}

static void mqtt_subscribe(struct client *c, const char *filter) {
    char who[128];
    describe(who, sizeof who, c);
    uint8_t p[512];
    size_t len = strlen(filter), i = 0;
    p[i++] = SUBSCRIBE << 4 | 0x2;
    i += put_varint(p + i, 2 + 2 + len + 1);
    i += put_u16(p + i, 1);
    i += put_str(p + i, filter, len);
    p[i++] = (uint8_t)opt.qos;
    send_all(c, p, i);
    struct frame f = await_packet(c, "SUBACK");
    if (f.type != SUBACK || f.len < 3)
        die("%s: expected SUBACK, got packet type %u", who, f.type);
    if (f.body[2] & 0x80)
        die("%s: SUBSCRIBE to %s refused (SUBACK 0x%02x)", who, filter, f.body[2]);
}

static void topic_of(char *out, size_t n, enum role role, int index) {
    bool own = opt.topology == PAIRS;  // pairs: one topic per publisher
    snprintf(out, n, "%sbench/%d", role == SUBSCRIBER && opt.topology == SHARED
                                       ? "$share/bench/" : "", own ? index : 0);
}

static void setup_publisher(struct client *c) {
    char topic[64];
    topic_of(topic, sizeof topic, PUBLISHER, c->index);
    size_t topic_len = strlen(topic);
    c->packet_size = publish_size(topic_len, opt.payload, opt.qos);
    c->template = xrealloc(NULL, c->packet_size);
    uint8_t *payload = xrealloc(NULL, opt.payload);
    memset(payload, 'x', opt.payload);
    encode_publish(c->template, topic, topic_len, payload, opt.payload, opt.qos, 0);
    free(payload);
    c->payload_at = c->packet_size - opt.payload;
    // A QoS 0 flood writes 64 KiB at a time; bounded, a batch well under the bound, so
    // it is not overshot by much (as bench/loadgen.py's Flood).
    c->batch = BATCH_BYTES / c->packet_size;
    if (opt.backlog && c->batch > opt.backlog / (4 * fanout))
        c->batch = opt.backlog / (4 * fanout);
    if (c->batch < 1)
        c->batch = 1;
    c->next_packet_id = 1;
    if (opt.qos)
        c->seq_of_id = xcalloc(MAX_PACKET_ID + 1, sizeof *c->seq_of_id);
}

static void connect_all(void) {
    char random_part[20] = "";
    if (opt.persistent) {  // sessions of this run only, never one the broker kept
        uint32_t r;
        if (getrandom(&r, sizeof r, 0) != sizeof r)
            die("getrandom: %s", strerror(errno));
        snprintf(random_part, sizeof random_part, "-%08" PRIx32, r);
    }
    char id[256], filter[64];
    for (int i = 0; i < opt.subscribers; i++) {
        struct client *c = &subs[i];
        c->role = SUBSCRIBER;
        c->index = i;
        c->seen = xcalloc((size_t)opt.publishers, sizeof *c->seen);
        snprintf(id, sizeof id, "%s%s-sub%d", opt.id_prefix, random_part, i);
        mqtt_connect(c, id, !opt.persistent);
        topic_of(filter, sizeof filter, SUBSCRIBER, i);
        mqtt_subscribe(c, filter);
        char topic[64];
        topic_of(topic, sizeof topic, PUBLISHER, i);  // what it receives
        c->packet_size = publish_size(strlen(topic), opt.payload, opt.qos);
    }
    for (int i = 0; i < opt.publishers; i++) {
        struct client *c = &pubs[i];
        c->role = PUBLISHER;
        c->index = i;
        setup_publisher(c);
        snprintf(id, sizeof id, "%s-pub%d", opt.id_prefix, i);
        mqtt_connect(c, id, true);
    }
}

// How many bytes a client lets arrive before it is woken to read (SO_RCVLOWAT). A broker
// that writes packet by packet (Mosquitto) otherwise wakes a waiting reader for every
// packet, and on loopback the broker's CPU pays for each wake-up: it cost Mosquitto ~30%
// of a QoS 0 flood. The mark must stay below what the broker sends before it waits for
// an answer (QoS 1: its in-flight window), so it is an eighth of the window's bytes
// there. Paced loads read every packet at once: the mark would add to their latency;
// with --bulk-reads (a paced throughput row) they read as a flood does.
static int read_mark(const struct client *c) {
    bool bulk = opt.mode == FLOOD || opt.bulk_reads;
    if (c->role == PUBLISHER)  // QoS 1 PUBACKs: an eighth of the window's 4 bytes
        return opt.qos && bulk && opt.window >= 4 ? (int)(opt.window / 2) : 1;
    if (opt.read_mark >= 0)
        return (int)opt.read_mark;
    if (!bulk)
        return 1;
    char topic[64];
    topic_of(topic, sizeof topic, PUBLISHER, c->index);  // what the subscriber receives
    size_t size = publish_size(strlen(topic), opt.payload, opt.qos);
    size_t mark = opt.qos ? opt.window * size / 8 : MAX_READ_MARK;
    // Bounded: the publishers stop at the bound, which every subscriber holding just
    // under its mark could reach: a quarter of each one's share of the bound, at most.
    if (opt.backlog && mark > opt.backlog * size / (4 * (uint64_t)opt.subscribers))
        mark = opt.backlog * size / (4 * (uint64_t)opt.subscribers);
    return mark < 1 ? 1 : mark < MAX_READ_MARK ? (int)mark : MAX_READ_MARK;
}

// Client i of each role goes to thread i % threads: pairs stay together.
static void assign(struct client *c) {
    struct gen_thread *t = &threads[c->index % opt.threads];
    c->thread = t;
    t->clients[t->nclients++] = c;
    set_nonblocking_nodelay(c->fd);
    c->read_mark = read_mark(c);
    if (c->read_mark > 1)
        setsockopt(c->fd, SOL_SOCKET, SO_RCVLOWAT, &c->read_mark, sizeof c->read_mark);
    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = c};
    if (epoll_ctl(t->epoll, EPOLL_CTL_ADD, c->fd, &ev) != 0)
        die("epoll_ctl: %s", strerror(errno));
}

static void start_threads(void) {
    threads = xcalloc((size_t)opt.threads, sizeof *threads);
    for (int i = 0; i < opt.threads; i++) {
        struct gen_thread *t = &threads[i];
        t->epoll = epoll_create1(EPOLL_CLOEXEC);
        if (t->epoll < 0)
            die("epoll_create1: %s", strerror(errno));
        t->clients = xcalloc((size_t)(opt.publishers + opt.subscribers), sizeof *t->clients);
        t->latency_cap = 1 << 20;
        t->latency_us = xrealloc(NULL, t->latency_cap * sizeof *t->latency_us);
        t->timer = -1;
        if (opt.mode == PACED) {
            t->timer = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
            struct itimerspec every = {{0, TICK_NS}, {0, TICK_NS}};
            struct epoll_event ev = {.events = EPOLLIN, .data.ptr = NULL};
            if (t->timer < 0 || timerfd_settime(t->timer, 0, &every, NULL) != 0 ||
                epoll_ctl(t->epoll, EPOLL_CTL_ADD, t->timer, &ev) != 0)
                die("timerfd: %s", strerror(errno));
        }
    }
    for (int i = 0; i < opt.subscribers; i++)
        assign(&subs[i]);
    for (int i = 0; i < opt.publishers; i++)
        assign(&pubs[i]);
    for (int i = 0; i < opt.threads; i++)
        if (pthread_create(&threads[i].id, NULL, gen_loop, &threads[i]) != 0)
            die("pthread_create failed");
}

// ---- measuring, by the main thread

struct snapshot {
    uint64_t at_ns;
    double cpu_s;
    uint64_t delivered, published, accepted;
    uint64_t owed;  // PUBLISHes the kernel took x subscribers per message - delivered
};

// Bytes the broker's kernel holds for it, unread, per local port of ours: the rx_queue
// of the broker's end of each connection (local port = the broker's, remote = ours).
static void broker_unread(uint64_t *unread) {
    static const char *tables[] = {"/proc/net/tcp", "/proc/net/tcp6"};
    char line[512];
    for (size_t t = 0; t < 2; t++) {
        FILE *f = fopen(tables[t], "r");
        if (f == NULL)
            continue;
        while (fgets(line, sizeof line, f)) {
            char local[64], remote[64];
            unsigned tx, rx;
            if (sscanf(line, "%*s %63s %63s %*s %x:%x", local, remote, &tx, &rx) != 4)
                continue;  // the header
            const char *lp = strrchr(local, ':'), *rp = strrchr(remote, ':');
            if (lp == NULL || rp == NULL || (int)strtol(lp + 1, NULL, 16) != opt.port)
                continue;
            int remote_port = (int)strtol(rp + 1, NULL, 16);
            for (int i = 0; i < opt.publishers; i++)
                if (pubs[i].local_port == remote_port)
                    unread[i] += rx;
        }
        fclose(f);
    }
}

static struct snapshot snap(void) {
    struct snapshot s = {.at_ns = now_ns(), .cpu_s = cpu_seconds()};
    uint64_t *unread = xcalloc((size_t)opt.publishers, sizeof *unread);
    if (!opt.qos)
        broker_unread(unread);
    // Delivered: counted by the subscribers, plus the whole deliveries in their sockets
    // not read yet (a read mark lets up to 16 KiB wait), so a snapshot does not depend on
    // where the reads happen to fall.
    for (int i = 0; i < opt.subscribers; i++) {
        int waiting = 0;
        ioctl(subs[i].fd, FIONREAD, &waiting);
        s.delivered += peek(&subs[i].delivered) + (uint64_t)waiting / subs[i].packet_size;
    }
    for (int i = 0; i < opt.publishers; i++) {
        struct client *c = &pubs[i];
        uint64_t written = peek(&c->written);
        s.published += written / c->packet_size;
        if (opt.qos) {
            s.accepted += peek(&c->pubacks);
        } else {  // read by the broker: written, minus what waits in either kernel
            int queued = 0;
            ioctl(c->fd, SIOCOUTQ, &queued);
            uint64_t waiting = (uint64_t)queued + unread[i];
            s.accepted += written > waiting ? (written - waiting) / c->packet_size : 0;
        }
    }
    free(unread);
    s.owed = s.published * fanout > s.delivered ? s.published * fanout - s.delivered : 0;
    return s;
}

static void event(const char *name) {
    printf("{\"event\": \"%s\"}\n", name);
    fflush(stdout);
}

// Sleep, but give up at once if an event-loop thread failed.
static void wait_for(double seconds) {
    uint64_t end = now_ns() + (uint64_t)(seconds * 1e9);
    for (;;) {
        if (atomic_load(&failed)) {
            pthread_mutex_lock(&failure_lock);
            die("%s", failure);
        }
        uint64_t now = now_ns();
        if (now >= end)
            return;
        sleep_ns(end - now < 10000000u ? end - now : 10000000u);
    }
}

// QoS 1, once publishing stopped: until deliveries and acks stop for `settle` s (10 s
// at most), so `lost` counts what never came, not what was still on its way.
static void settle(void) {
    uint64_t deadline = now_ns() + 10000000000u, last = UINT64_MAX;
    while (now_ns() < deadline) {
        uint64_t seen = 0;
        for (int i = 0; i < opt.subscribers; i++)
            seen += peek(&subs[i].delivered);
        for (int i = 0; i < opt.publishers; i++)
            seen += peek(&pubs[i].pubacks);
        if (seen == last)
            return;
        last = seen;
        wait_for(opt.settle);
    }
}

// Acknowledged messages never delivered: per subscriber for a fan-out (each should get
// every message), else to any subscriber (each message goes to one).
static uint64_t count_lost(void) {
    uint64_t lost = 0;
    for (int p = 0; p < opt.publishers; p++) {
        const struct bits *acked = &pubs[p].acked;
        int receivers = opt.topology == FANOUT ? opt.subscribers : 1;
        for (int r = 0; r < receivers; r++) {
            for (size_t w = 0; w < acked->nwords; w++) {
                uint64_t seen = 0;
                if (opt.topology == FANOUT)
                    seen = bits_word(&subs[r].seen[p], w);
                else
                    for (int s = 0; s < opt.subscribers; s++)
                        seen |= bits_word(&subs[s].seen[p], w);
                lost += (uint64_t)__builtin_popcountll(acked->words[w] & ~seen);
            }
        }
    }
    return lost;
}

static int by_value(const void *a, const void *b) {
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return (x > y) - (x < y);
}

static void print_ms(const char *name, const uint32_t *sorted, size_t n, double q) {
    if (n == 0) {
        printf(", \"%s\": null", name);
        return;
    }
    size_t i = (size_t)(q * (double)(n - 1) + 0.5);
    printf(", \"%s\": %.3f", name, sorted[i < n ? i : n - 1] / 1000.0);
}

static void report(const struct snapshot *s0, const struct snapshot *s1, bool lost_counted,
                   uint64_t lost) {
    size_t n = 0;
    for (int i = 0; i < opt.threads; i++)
        n += threads[i].nlatency;
    uint32_t *all = xrealloc(NULL, (n ? n : 1) * sizeof *all);
    size_t at = 0;
    for (int i = 0; i < opt.threads; i++) {
        memcpy(all + at, threads[i].latency_us, threads[i].nlatency * sizeof *all);
        at += threads[i].nlatency;
    }
    qsort(all, n, sizeof *all, by_value);

    double elapsed = (double)(s1->at_ns - s0->at_ns) / 1e9;
    uint64_t delivered = s1->delivered - s0->delivered;
    uint64_t accepted = s1->accepted > s0->accepted ? s1->accepted - s0->accepted : 0;
    uint64_t published = s1->published - s0->published;
    printf("{\"delivered_per_s\": %.1f, \"published_per_s\": %.1f, \"accepted_per_s\": %.1f",
           delivered / elapsed, published / elapsed, accepted / elapsed);
    printf(", \"delivered\": %" PRIu64 ", \"published\": %" PRIu64 ", \"accepted\": %" PRIu64,
           delivered, published, accepted);
    printf(", \"elapsed_s\": %.6f, \"owed\": %" PRIu64, elapsed, s1->owed);
    print_ms("p50_ms", all, n, 0.50);
    print_ms("p99_ms", all, n, 0.99);
    print_ms("p999_ms", all, n, 0.999);
    print_ms("max_ms", all, n, 1.0);
    // `lost` is over the whole run, so is its base: every PUBACK received.
    uint64_t acked = 0;
    for (int i = 0; i < opt.publishers; i++)
        acked += peek(&pubs[i].pubacks);
    if (lost_counted)
        printf(", \"lost\": %" PRIu64 ", \"acked_total\": %" PRIu64, lost, acked);
    else
        printf(", \"lost\": null, \"acked_total\": null");
    printf(", \"cpu_s\": %.3f, \"connections\": %d, \"threads\": %d}\n", s1->cpu_s - s0->cpu_s,
           opt.publishers + opt.subscribers, opt.threads);
    fflush(stdout);
    free(all);
}

// Wait for a line (or end of file) on stdin: the wrapper's cue that the load may stop.
static void hold(void) {
    char c;
    ssize_t n;
    while ((n = read(STDIN_FILENO, &c, 1)) > 0 || (n < 0 && errno == EINTR))
        if (n > 0 && c == '\n')
            return;
}

static void usage(FILE *out) {
    fputs("usage: mqttgen run [--host H] [--port P] [--publishers N] [--subscribers M]\n"
          "                   [--topology pairs|fanout|fanin|shared] [--qos 0|1]\n"
          "                   [--payload BYTES] [--window N] [--mode flood|paced]\n"
          "                   [--rate MSGS_PER_S] [--backlog N] [--warmup S] [--duration S]\n"
          "                   [--settle S] [--persistent] [--threads T] [--hold]\n"
          "                   [--clean-id-prefix X] [--read-low-water BYTES] [--bulk-reads]\n"
          "                   [--username U] [--password P] [--sub-host H] [--sub-port P]\n"
          "       mqttgen sink [--port P]\n",
          out);
}

static double number(const char *name, const char *text, double low) {
    char *end;
    double v = strtod(text, &end);
    if (*text == '\0' || *end != '\0' || !(v >= low))
        die("--%s: expected a number >= %g, got '%s'", name, low, text);
    return v;
}

static void parse_run(int argc, char **argv) {
    static const struct option longs[] = {
        {"host", required_argument, 0, 'h'},      {"port", required_argument, 0, 'p'},
        {"publishers", required_argument, 0, 'P'}, {"subscribers", required_argument, 0, 'S'},
        {"topology", required_argument, 0, 'T'},   {"qos", required_argument, 0, 'q'},
        {"payload", required_argument, 0, 'b'},    {"window", required_argument, 0, 'w'},
        {"mode", required_argument, 0, 'm'},       {"rate", required_argument, 0, 'r'},
        {"warmup", required_argument, 0, 'W'},     {"duration", required_argument, 0, 'd'},
        {"settle", required_argument, 0, 's'},     {"persistent", no_argument, 0, 'k'},
        {"threads", required_argument, 0, 't'},    {"clean-id-prefix", required_argument, 0, 'i'},
        {"hold", no_argument, 0, 'H'},             {"read-low-water", required_argument, 0, 'L'},
        {"backlog", required_argument, 0, 'B'},     {"bulk-reads", no_argument, 0, 'R'},
        {"username", required_argument, 0, 'u'},    {"password", required_argument, 0, 'x'},
        {"sub-host", required_argument, 0, 'y'},    {"sub-port", required_argument, 0, 'z'},
        {"help", no_argument, 0, '?'},
        {0, 0, 0, 0},
    };
    int o;
    while ((o = getopt_long(argc, argv, "", longs, NULL)) != -1) {
        const char *name = "";
        for (const struct option *l = longs; l->name; l++)
            if (l->val == o)
                name = l->name;
        switch (o) {
        case 'h': opt.host = optarg; break;
        case 'p': opt.port = (int)number(name, optarg, 1); break;
        case 'P': opt.publishers = (int)number(name, optarg, 1); break;
        case 'S': opt.subscribers = (int)number(name, optarg, 1); break;
        case 'q': opt.qos = (unsigned)number(name, optarg, 0); break;
        case 'b': opt.payload = (size_t)number(name, optarg, STAMP_BYTES); break;
        case 'w': opt.window = (unsigned)number(name, optarg, 1); break;
        case 'r': opt.rate = number(name, optarg, 0); break;
        case 'B': opt.backlog = (uint64_t)number(name, optarg, 0); break;
        case 'W': opt.warmup = number(name, optarg, 0); break;
        case 'd': opt.duration = number(name, optarg, 0.001); break;
        case 's': opt.settle = number(name, optarg, 0); break;
        case 'k': opt.persistent = true; break;
        case 'R': opt.bulk_reads = true; break;
        case 't': opt.threads = (int)number(name, optarg, 1); break;
        case 'i': opt.id_prefix = optarg; break;
        case 'u': opt.username = optarg; break;
        case 'x': opt.password = optarg; break;
        case 'y': opt.sub_host = optarg; break;
        case 'z': opt.sub_port = (int)number(name, optarg, 1); break;
        case 'H': opt.hold = true; break;
        case 'L': opt.read_mark = (long)number(name, optarg, 1); break;
        case 'T':
            if (!strcmp(optarg, "pairs")) opt.topology = PAIRS;
            else if (!strcmp(optarg, "fanout")) opt.topology = FANOUT;
            else if (!strcmp(optarg, "fanin")) opt.topology = FANIN;
            else if (!strcmp(optarg, "shared")) opt.topology = SHARED;
            else die("--topology: expected pairs, fanout, fanin or shared, got '%s'", optarg);
            break;
        case 'm':
            if (!strcmp(optarg, "flood")) opt.mode = FLOOD;
            else if (!strcmp(optarg, "paced")) opt.mode = PACED;
            else die("--mode: expected flood or paced, got '%s'", optarg);
            break;
        default: usage(stderr); exit(2);
        }
    }
    if (optind != argc)
        die("unexpected argument '%s'", argv[optind]);
    if (opt.qos > 1)
        die("--qos: 0 or 1");
    if (opt.qos && opt.payload < TRACE_BYTES)
        die("--payload: at least %d bytes at QoS 1 (stamp, publisher, sequence)", TRACE_BYTES);
    if (opt.window > MAX_PACKET_ID)
        die("--window: at most %u", MAX_PACKET_ID);
    if (opt.mode == PACED && opt.rate <= 0)
        die("--mode paced needs --rate");
    if (opt.topology == PAIRS && opt.subscribers > opt.publishers)
        die("--topology pairs: at most one subscriber per publisher");
    if (strlen(opt.id_prefix) > 200)
        die("--clean-id-prefix: at most 200 characters");
    if ((opt.username && strlen(opt.username) > 300) || (opt.password && strlen(opt.password) > 300))
        die("--username, --password: at most 300 characters");
}

static int run_main(int argc, char **argv) {
    parse_run(argc, argv);
    char port[16];
    snprintf(port, sizeof port, "%d", opt.port);
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM};
    int err = getaddrinfo(opt.host, port, &hints, &broker_addr);
    if (err)
        die("%s: %s", opt.host, gai_strerror(err));
    sub_addr = broker_addr;
    if (opt.sub_port) {
        if (!opt.sub_host)
            opt.sub_host = opt.host;
        snprintf(port, sizeof port, "%d", opt.sub_port);
        err = getaddrinfo(opt.sub_host, port, &hints, &sub_addr);
        if (err)
            die("%s: %s", opt.sub_host, gai_strerror(err));
    }
    fanout = opt.topology == FANOUT ? (uint64_t)opt.subscribers : 1;
    pubs = xcalloc((size_t)opt.publishers, sizeof *pubs);
    subs = xcalloc((size_t)opt.subscribers, sizeof *subs);
    connect_all();  // every SUBACK in before the first PUBLISH

    event("load");
    start_threads();
    wait_for(opt.warmup);
    struct snapshot s0 = snap();
    atomic_store(&phase, MEASURING);
    event("start");
    wait_for(opt.duration);
    struct snapshot s1 = snap();
    atomic_store(&phase, HOLDING);
    event("end");
    if (opt.hold)
        hold();
    atomic_store(&phase, DRAINING);
    bool count = opt.qos && opt.settle > 0;
    if (count)
        settle();
    atomic_store(&phase, DONE);
    for (int i = 0; i < opt.threads; i++)
        pthread_join(threads[i].id, NULL);
    if (atomic_load(&failed))
        die("%s", failure);
    report(&s0, &s1, count, count ? count_lost() : 0);
    return 0;
}

// ---------------------------------------------------------------------------------------
// sink: the cheapest "broker" the generator can be measured against

#define SINK_READ_BYTES (256 * 1024)
// A subscriber holding more output than this stops every publisher until it is below
// the low mark: memory stays bounded and no delivery is dropped.
#define SINK_HIGH (1024 * 1024)
#define SINK_LOW (256 * 1024)

struct sink_conn {
    int fd;
    struct buf in, out;
    bool watching_out, paused, over, dirty, dead;
    unsigned next_packet_id;
};

struct member {
    struct sink_conn *conn;
    unsigned qos;
};

// The subscribers of one exact topic: all of them, or one per message in a shared group.
struct route {
    char *topic, *group;  // group NULL: a plain subscription
    size_t topic_len;
    struct member *members;
    size_t n, cap, next;  // next: the group's round robin
};

static struct sink {
    int epoll, listener;
    struct route *routes;
    size_t nroutes;
    struct sink_conn **conns, **dirty, **dead;
    size_t nconns, ndirty, ndead;
    size_t congested;  // connections over SINK_HIGH
} sk;

static void push(struct sink_conn ***list, size_t *n, struct sink_conn *c) {
    if ((*n & (*n - 1)) == 0)  // grows at powers of two
        *list = xrealloc(*list, (*n ? *n * 2 : 16) * sizeof **list);
    (*list)[(*n)++] = c;
}

static void sink_watch(struct sink_conn *c) {
    uint32_t events = (c->paused ? 0u : EPOLLIN) | (c->watching_out ? EPOLLOUT : 0u);
    struct epoll_event ev = {.events = events, .data.ptr = c};
    epoll_ctl(sk.epoll, EPOLL_CTL_MOD, c->fd, &ev);
}

static struct buf *output(struct sink_conn *c) {
    if (!c->dirty) {
        c->dirty = true;
        push(&sk.dirty, &sk.ndirty, c);
    }
    return &c->out;
}

static void sink_close(struct sink_conn *c) {
    if (c->dead)
        return;
    c->dead = true;
    if (c->over)
        sk.congested--;
    for (size_t r = 0; r < sk.nroutes; r++) {
        struct route *route = &sk.routes[r];
        size_t m = 0;
        while (m < route->n) {
            if (route->members[m].conn == c)
                route->members[m] = route->members[--route->n];
            else
                m++;
        }
    }
    for (size_t i = 0; i < sk.nconns; i++)
        if (sk.conns[i] == c)
            sk.conns[i] = sk.conns[--sk.nconns];
    close(c->fd);
    push(&sk.dead, &sk.ndead, c);  // freed after this round: it may be in the dirty list
}

static struct route *route_of(const uint8_t *topic, size_t len, const char *group,
                              size_t group_len) {
    for (size_t r = 0; r < sk.nroutes; r++) {
        struct route *route = &sk.routes[r];
        bool same_group = group ? route->group && strlen(route->group) == group_len &&
                                      !memcmp(route->group, group, group_len)
                                : route->group == NULL;
        if (route->topic_len == len && !memcmp(route->topic, topic, len) && same_group)
            return route;
    }
    sk.routes = xrealloc(sk.routes, (sk.nroutes + 1) * sizeof *sk.routes);
    struct route *route = &sk.routes[sk.nroutes++];
    *route = (struct route){.topic = strndup((const char *)topic, len), .topic_len = len};
    if (group)
        route->group = strndup(group, group_len);
    return route;
}

// Apply one SUBSCRIBE (granted QoS: as asked, at most 1) or UNSUBSCRIBE (qos < 0).
static void sink_subscribe(struct sink_conn *c, const uint8_t *filter, size_t len, int qos) {
    const char *group = NULL;
    size_t group_len = 0;
    if (len > 7 && !memcmp(filter, "$share/", 7)) {
        const uint8_t *slash = memchr(filter + 7, '/', len - 7);
        if (slash) {
            group = (const char *)filter + 7;
            group_len = (size_t)(slash - filter) - 7;
            len -= (size_t)(slash + 1 - filter);
            filter = slash + 1;
        }
    }
    struct route *route = route_of(filter, len, group, group_len);
    for (size_t m = 0; m < route->n; m++) {
        if (route->members[m].conn == c) {
            if (qos < 0)
                route->members[m] = route->members[--route->n];
            else
                route->members[m].qos = (unsigned)qos;
            return;
        }
    }
    if (qos < 0)
        return;
    if (route->n == route->cap) {
        route->cap = route->cap ? route->cap * 2 : 8;
        route->members = xrealloc(route->members, route->cap * sizeof *route->members);
    }
    route->members[route->n++] = (struct member){c, (unsigned)qos};
}

static void sink_deliver(struct member *m, const struct publish *p) {
    struct sink_conn *c = m->conn;
    unsigned qos = p->qos < m->qos ? p->qos : m->qos;
    unsigned id = 0;
    if (qos) {
        id = c->next_packet_id;
        c->next_packet_id = id % MAX_PACKET_ID + 1;
    }
    struct buf *out = output(c);
    size_t most = 1 + 4 + 2 + p->topic_len + 2 + p->payload_len;
    out->end += encode_publish(buf_room(out, most, 1), (const char *)p->topic, p->topic_len,
                               p->payload, p->payload_len, qos, id);
    if (!c->over && buf_pending(out) > SINK_HIGH) {
        c->over = true;
        sk.congested++;
    }
}

static void sink_publish(struct sink_conn *c, const struct publish *p) {
    if (p->qos == 1)
        put_ack(output(c), PUBACK, 0, p->packet_id);
    for (size_t r = 0; r < sk.nroutes; r++) {
        struct route *route = &sk.routes[r];
        if (route->n == 0 || route->topic_len != p->topic_len ||
            memcmp(route->topic, p->topic, p->topic_len))
            continue;
        if (route->group)
            sink_deliver(&route->members[route->next++ % route->n], p);
        else
            for (size_t m = 0; m < route->n; m++)
                sink_deliver(&route->members[m], p);
    }
}

static bool sink_packet(struct sink_conn *c, const struct frame *f) {
    const uint8_t *b = f->body;
    switch (f->type) {
    case CONNECT:
        buf_put(output(c), (const uint8_t[]){CONNACK << 4, 2, 0, 0}, 4);
        return true;
    case PUBLISH: {
        struct publish p;
        if (!parse_publish(f, &p) || p.qos > 1)
            return false;
        sink_publish(c, &p);
        return true;
    }
    case SUBSCRIBE:
    case UNSUBSCRIBE: {
        if (f->len < 2)
            return false;
        uint8_t codes[256];
        size_t n = 0, at = 2;
        while (at + 2 <= f->len && n < sizeof codes) {
            size_t len = get_u16(b + at);
            bool sub = f->type == SUBSCRIBE;
            if (at + 2 + len + sub > f->len)
                return false;
            int qos = sub ? (b[at + 2 + len] > 1 ? 1 : b[at + 2 + len]) : -1;
            sink_subscribe(c, b + at + 2, len, qos);
            codes[n++] = (uint8_t)(qos < 0 ? 0 : qos);
            at += 2 + len + sub;
        }
        struct buf *out = output(c);
        if (f->type == UNSUBSCRIBE) {
            put_ack(out, UNSUBACK, 0, get_u16(b));
            return true;
        }
        uint8_t head[8] = {SUBACK << 4};
        size_t i = 1 + put_varint(head + 1, 2 + n);
        i += put_u16(head + i, get_u16(b));
        buf_put(out, head, i);
        buf_put(out, codes, n);
        return true;
    }
    case PINGREQ:
        buf_put(output(c), (const uint8_t[]){PINGRESP << 4, 0}, 2);
        return true;
    case DISCONNECT:
        return false;
    default:  // PUBACKs of deliveries: the sink keeps no in-flight state
        return true;
    }
}

// Handle buffered input; a PUBLISH met while some subscriber is over its bound pauses
// this connection, leaving the rest in its buffer until the subscribers have drained.
static void sink_process(struct sink_conn *c) {
    struct frame f;
    int got;
    while ((got = parse_frame(c->in.data + c->in.start, buf_pending(&c->in), &f)) == 1) {
        if (f.type == PUBLISH && sk.congested) {
            c->paused = true;
            sink_watch(c);
            break;
        }
        c->in.start += f.size;
        if (!sink_packet(c, &f)) {
            sink_close(c);
            return;
        }
    }
    if (got < 0 || (got == 0 && buf_pending(&c->in) == c->in.cap)) {  // malformed, too big
        sink_close(c);
        return;
    }
    buf_compact(&c->in);
}

static void sink_read(struct sink_conn *c) {
    if (c->paused || c->dead)
        return;
    ssize_t n = read(c->fd, c->in.data + c->in.end, c->in.cap - c->in.end);
    if (n > 0) {
        c->in.end += (size_t)n;
        sink_process(c);
    } else if (n == 0 || (errno != EAGAIN && errno != EINTR)) {
        sink_close(c);
    }
}

static void sink_flush(struct sink_conn *c) {
    while (buf_pending(&c->out)) {
        ssize_t n = write(c->fd, c->out.data + c->out.start, buf_pending(&c->out));
        if (n > 0) {
            c->out.start += (size_t)n;
        } else if (n < 0 && errno == EINTR) {
            continue;
        } else if (n < 0 && errno == EAGAIN) {
            break;
        } else {
            sink_close(c);
            return;
        }
    }
    if (buf_pending(&c->out) == 0)
        c->out.start = c->out.end = 0;
    if (c->over && buf_pending(&c->out) < SINK_LOW) {
        c->over = false;
        sk.congested--;
    }
    bool want = buf_pending(&c->out) > 0;
    if (want != c->watching_out) {
        c->watching_out = want;
        sink_watch(c);
    }
}

static void sink_accept(void) {
    for (;;) {
        int fd = accept4(sk.listener, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0)
            return;  // EAGAIN: all taken; anything else: the client is gone already
        set_nonblocking_nodelay(fd);
        struct sink_conn *c = xcalloc(1, sizeof *c);
        c->fd = fd;
        c->next_packet_id = 1;
        c->in.cap = SINK_READ_BYTES;
        c->in.data = xrealloc(NULL, c->in.cap);
        push(&sk.conns, &sk.nconns, c);
        struct epoll_event ev = {.events = EPOLLIN, .data.ptr = c};
        epoll_ctl(sk.epoll, EPOLL_CTL_ADD, fd, &ev);
    }
}

static int sink_main(int argc, char **argv) {
    int port = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--port") && i + 1 < argc)
            port = (int)number("port", argv[++i], 0);
        else
            die("sink: unexpected argument '%s'", argv[i]);
    }
    sk.listener = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    int one = 1;
    setsockopt(sk.listener, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof addr;
    if (bind(sk.listener, (struct sockaddr *)&addr, sizeof addr) != 0 ||
        listen(sk.listener, 1024) != 0 ||
        getsockname(sk.listener, (struct sockaddr *)&addr, &len) != 0)
        die("sink: listen on 127.0.0.1:%d: %s", port, strerror(errno));
    sk.epoll = epoll_create1(EPOLL_CLOEXEC);
    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = NULL};
    epoll_ctl(sk.epoll, EPOLL_CTL_ADD, sk.listener, &ev);
    printf("{\"port\": %d}\n", ntohs(addr.sin_port));
    fflush(stdout);

    struct epoll_event events[256];
    for (;;) {
        int n = epoll_wait(sk.epoll, events, 256, sk.ndirty ? 0 : -1);
        if (n < 0 && errno != EINTR)
            die("epoll_wait: %s", strerror(errno));
        for (int i = 0; i < n; i++) {
            struct sink_conn *c = events[i].data.ptr;
            if (c == NULL) {
                sink_accept();
                continue;
            }
            if (events[i].events & (EPOLLIN | EPOLLERR | EPOLLHUP))
                sink_read(c);
            if (events[i].events & EPOLLOUT && !c->dead)
                output(c);
        }
        // One write per connection per round, whatever the round produced for it.
        size_t ndirty = sk.ndirty;
        sk.ndirty = 0;
        for (size_t i = 0; i < ndirty; i++) {
            struct sink_conn *c = sk.dirty[i];
            c->dirty = false;
            if (!c->dead)
                sink_flush(c);
        }
        if (!sk.congested) {  // resuming may congest again: then it stops at once
            // Backwards: closing swaps the last connection into the closed one's place.
            for (size_t i = sk.nconns; i-- > 0 && !sk.congested;) {
                struct sink_conn *c = sk.conns[i];
                if (c->paused) {
                    c->paused = false;
                    sink_watch(c);
                    sink_process(c);
                }
            }
        }
        for (size_t i = 0; i < sk.ndead; i++) {
            free(sk.dead[i]->in.data);
            free(sk.dead[i]->out.data);
            free(sk.dead[i]);
        }
        sk.ndead = 0;
    }
}

int main(int argc, char **argv) {
    signal(SIGPIPE, SIG_IGN);  // a closed peer is an error from write(), not a signal
    if (argc >= 2 && !strcmp(argv[1], "run"))
        return run_main(argc - 1, argv + 1);
    if (argc >= 2 && !strcmp(argv[1], "sink"))
        return sink_main(argc - 1, argv + 1);
    usage(argc >= 2 && !strcmp(argv[1], "--help") ? stdout : stderr);
    return argc >= 2 && !strcmp(argv[1], "--help") ? 0 : 2;
}
