/* event_relay._recorder: event_relay/recorder.py's Recorder, in C.
 *
 * Why: the broker's own cost of a delivery is about a microsecond, and in Python
 * recording one costs a quarter of that at best: with every event relayed the broker
 * lost 20-40% of its throughput (docs/performance.md, "Event relay"). Here a delivery
 * costs a few dozen nanoseconds. recorder.py is the reference: this file does the same,
 * record for record (tests/event_relay/test_recorder.py runs both against each other),
 * and it is used when it was built and no sampling rule is set (plugin.py).
 *
 * What it does (recorder.py says why): a run is one message's on_publish and the
 * deliveries that follow it (event_relay/schema.py: PUBLISH_DELIVERIES, or DELIVERIES
 * without the publish), or one receiver's deliveries and completions (SESSION_EVENTS),
 * encoded as they happen into one buffer as a msgpack record; the count of its receivers
 * or items is written into its place when the run ends, then the sequence number,
 * and the records of a loop turn go to the log in one call at its end (EventLog.
 * append_records; PENDING_MAX at most). Integers are written in msgpack's smallest form except the
 * sequence number (always uint 64, so that it can be written last): a reader decodes both
 * the same. Only the recorder writes to the log (the relay's other events go through its
 * `append`), so the numbers it gives pending records are the log's next ones.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <string.h>
#include <time.h>

#define DELIVERIES 14
#define PUBLISH_DELIVERIES 15
#define SESSION_EVENTS 16
#define ON_PUBLISH 3
#define ON_DELIVER 6
#define ON_DELIVERY_COMPLETE 7
#define IDENTITIES_KEPT 65536
#define PENDING_MAX 1024 /* records kept before they go to the log (within a loop turn) */

typedef struct {
    char *data;
    Py_ssize_t size, capacity;
} Buffer;

typedef struct {
    PyObject_HEAD
    PyObject *log;           /* EventLog */
    PyObject *append_event;  /* log.append(code, values) */
    PyObject *schedule;      /* schedule(callback): once per loop turn, the end of a run */
    PyObject *turn_ended;    /* this recorder's _turn_ended, bound once */
    PyObject *append_records; /* log.append_records(codes, records, counts) */
    PyObject *pending;       /* records made but not yet handed to the log */
    Buffer pending_codes;    /* their type codes */
    Buffer pending_starts;   /* their first sequence numbers (int64, native order) */
    Py_ssize_t pending_size; /* their bytes */
    unsigned long long next_seq; /* the next record's, while some are pending */
    PyObject *identities;    /* session id -> a receiver's first four fields, encoded */
    PyObject *message;       /* a message run's message, or NULL */
    PyObject *who;           /* a session run's session id, or a DELIVERIES run's while it
                                has one receiver; else NULL */
    int publish, deliver, complete, full, sizes;
    int code;                /* of the open run; 0: none */
    int end_due;
    Py_ssize_t count_at;     /* where the open record's receiver (or item) count goes */
    Py_ssize_t receivers_at; /* where its receivers (items) begin, after their bin's header */
    Py_ssize_t flags_at;     /* where the last receiver's qos, retain, persisted begin */
    Py_ssize_t receivers;
    Buffer buffer;           /* the open record */
    Buffer scratch;          /* where a DELIVERIES run is rewritten as a session run */
} Recorder;

/* -- reading the broker's objects ----------------------------------------------------------
 * The broker's objects keep their fields in __slots__: once a type is seen, a field is
 * read at its offset in the object (a getattr costs more than the rest of a delivery's
 * recording). Another type, or a field that is not a plain slot, is read by getattr.
 * The fields, by prefix: D_ a delivery, M_ a message, A_ a MatchedAcl, P_ the publishing
 * client, R_ the receiving session. They are hooks/recorder.py's Recorded* protocols, which
 * the type checker holds the broker's classes to; tests/hooks reads these lines to check
 * that they name no other field. */

typedef struct {
    const char *text;
    PyObject *name;       /* interned */
    PyTypeObject *type;   /* whose slot offset is known (a strong reference), or NULL */
    Py_ssize_t offset;
} Field;

static Field D_MESSAGE = {"message"}, D_QOS = {"qos"}, D_RETAIN = {"retain"}, D_SEQ = {"seq"},
             M_TOPIC = {"topic"}, M_PAYLOAD = {"payload"}, M_ACL = {"acl_name"},
             M_QOS = {"qos"}, M_RETAIN = {"retain"}, A_NAME = {"name"}, A_PATTERN = {"pattern"},
             P_CLIENT_ID = {"client_id"}, P_MOUNTPOINT = {"mountpoint"},
             P_USERNAME = {"username"}, P_SESSION_ID = {"session_id"},
             R_CLIENT_ID = {"client_id"}, R_MOUNTPOINT = {"mountpoint"},
             R_USERNAME = {"username"}, R_SESSION_ID = {"session_id"};
static Field *FIELDS[] = {&D_MESSAGE,    &D_QOS,        &D_RETAIN,     &D_SEQ,
                          &M_TOPIC,      &M_PAYLOAD,    &M_ACL,        &M_QOS,
                          &M_RETAIN,     &A_NAME,       &A_PATTERN,    &P_CLIENT_ID,
                          &P_MOUNTPOINT, &P_USERNAME,   &P_SESSION_ID, &R_CLIENT_ID,
                          &R_MOUNTPOINT, &R_USERNAME,   &R_SESSION_ID};
static Field *PUBLISHER[] = {&P_CLIENT_ID, &P_MOUNTPOINT, &P_USERNAME, &P_SESSION_ID};
static Field *RECEIVER[] = {&R_CLIENT_ID, &R_MOUNTPOINT, &R_USERNAME, &R_SESSION_ID};
static PyObject *s_next_seq, *s_turn_ended;

static int learn(Field *field, PyTypeObject *type) {
    PyObject *descriptor = _PyType_Lookup(type, field->name); /* borrowed */
    if (descriptor == NULL || Py_TYPE(descriptor) != &PyMemberDescr_Type)
        return 0;
    PyMemberDef *member = ((PyMemberDescrObject *)descriptor)->d_member;
    if (member->type != T_OBJECT_EX)
        return 0;
    Py_INCREF(type);
    Py_XSETREF(field->type, type);
    field->offset = member->offset;
    return 1;
}

/* obj.<field> when its type's slot offset is not known yet, or it is not a set slot. */
static PyObject *get_slowly(Field *field, PyObject *obj) {
    if (learn(field, Py_TYPE(obj))) {
        PyObject *value = *(PyObject **)((char *)obj + field->offset);
        if (value != NULL) {
            Py_INCREF(value);
            return value;
        }
    }
    return PyObject_GetAttr(obj, field->name); /* also raises for an unset slot */
}

/* obj.<field>, a new reference. Inline: a QoS 1 message's events read some twenty. */
static inline PyObject *get(Field *field, PyObject *obj) {
    if (Py_TYPE(obj) == field->type) {
        PyObject *value = *(PyObject **)((char *)obj + field->offset);
        if (value != NULL) {
            Py_INCREF(value);
            return value;
        }
    }
    return get_slowly(field, obj);
}

/* -- msgpack, into a buffer ------------------------------------------------------------ */

static int grow(Buffer *b, Py_ssize_t more) {
    if (b->size + more <= b->capacity)
        return 0;
    Py_ssize_t capacity = b->capacity ? b->capacity : 256;
    while (capacity < b->size + more)
        capacity *= 2;
    char *data = PyMem_Realloc(b->data, capacity);
    if (data == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    b->data = data;
    b->capacity = capacity;
    return 0;
}

static int put(Buffer *b, const void *data, Py_ssize_t size) {
    if (grow(b, size) < 0)
        return -1;
    memcpy(b->data + b->size, data, size);
    b->size += size;
    return 0;
}

static int put_byte(Buffer *b, unsigned char byte) { return put(b, &byte, 1); }

static void big_endian(unsigned char *out, unsigned long long value, int width) {
    for (int i = width - 1; i >= 0; i--) {
        out[i] = value & 0xff;
        value >>= 8;
    }
}

static int put_head(Buffer *b, unsigned char kind, unsigned long long value, int width) {
    unsigned char out[9];
    out[0] = kind;
    big_endian(out + 1, value, width);
    return put(b, out, 1 + width);
}

static int put_uint(Buffer *b, unsigned long long value) {
    if (value < 128)
        return put_byte(b, (unsigned char)value);
    if (value < 256)
        return put_head(b, 0xcc, value, 1);
    if (value < 65536)
        return put_head(b, 0xcd, value, 2);
    if (value < 4294967296ULL)
        return put_head(b, 0xce, value, 4);
    return put_head(b, 0xcf, value, 8);
}

static int put_raw(Buffer *b, const char *data, Py_ssize_t size, int bin) {
    int rc;
    if (bin)
        rc = size < 256 ? put_head(b, 0xc4, size, 1)
             : size < 65536 ? put_head(b, 0xc5, size, 2)
                            : put_head(b, 0xc6, size, 4);
    else
        rc = size < 32 ? put_byte(b, 0xa0 | (unsigned char)size)
             : size < 256 ? put_head(b, 0xd9, size, 1)
             : size < 65536 ? put_head(b, 0xda, size, 2)
                            : put_head(b, 0xdb, size, 4);
    return rc < 0 ? -1 : put(b, data, size);
}

/* A str (None: nil), as msgpack's Packer writes it. */
static int put_str(Buffer *b, PyObject *value) {
    if (value == Py_None)
        return put_byte(b, 0xc0);
    Py_ssize_t size;
    const char *data = PyUnicode_AsUTF8AndSize(value, &size);
    return data == NULL ? -1 : put_raw(b, data, size, 0);
}

/* A topic as its tree's clients know it: a mountpoint's topics are kept as
 * "\0<mountpoint>/<topic>" (broker/mountpoints.py); the mountpoint is a field of its own. */
static int put_topic(Buffer *b, PyObject *value) {
    Py_ssize_t size;
    const char *data = PyUnicode_AsUTF8AndSize(value, &size);
    if (data == NULL)
        return -1;
    if (size > 0 && data[0] == '\0') {
        const char *slash = memchr(data, '/', (size_t)size);
        Py_ssize_t skip = slash == NULL ? size : slash - data + 1;
        data += skip;
        size -= skip;
    }
    return put_raw(b, data, size, 0);
}

static int put_bool(Buffer *b, int value) { return put_byte(b, value ? 0xc3 : 0xc2); }

static int put_int_object(Buffer *b, PyObject *value) {
    unsigned long long n = PyLong_AsUnsignedLongLong(value);
    return (n == (unsigned long long)-1 && PyErr_Occurred()) ? -1 : put_uint(b, n);
}

/* payload_size and payload, as `payloads` asks. */
static int put_payload(Recorder *self, Buffer *b, PyObject *payload) {
    Py_buffer view; /* bytes as a rule; any bytes-like object will do */
    if (PyObject_GetBuffer(payload, &view, PyBUF_SIMPLE) < 0)
        return -1;
    int rc = self->sizes ? put_uint(b, view.len) : put_byte(b, 0xc0);
    if (rc == 0)
        rc = self->full ? put_raw(b, view.buf, view.len, 1) : put_byte(b, 0xc0);
    PyBuffer_Release(&view);
    return rc;
}

static unsigned long long now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (unsigned long long)ts.tv_sec * 1000000000ULL + ts.tv_nsec;
}

/* Every record begins so: an array 16 header with its number of fields, the sequence
 * number (written when the record is complete: at SEQ_AT), the ts, the type code. */
#define SEQ_AT 4
#define CODE_AT (SEQ_AT + 17)
static int put_start(Buffer *b, int fields, int code) {
    if (put_head(b, 0xdc, fields, 2) < 0 || put_head(b, 0xcf, 0, 8) < 0 ||
        put_head(b, 0xcf, now_ns(), 8) < 0)
        return -1;
    return put_byte(b, (unsigned char)code);
}

static int put_attr(Buffer *b, PyObject *obj, Field *field, int (*put_fn)(Buffer *, PyObject *)) {
    PyObject *value = get(field, obj);
    if (value == NULL)
        return -1;
    int rc = put_fn(b, value);
    Py_DECREF(value);
    return rc;
}

/* client_id, mountpoint, username, session_id: `fields` are who's. */
static int put_identity(Buffer *b, PyObject *who, Field **fields) {
    for (int i = 0; i < 4; i++)
        if (put_attr(b, who, fields[i], put_str) < 0)
            return -1;
    return 0;
}

static int put_truth(Buffer *b, PyObject *obj, Field *field) {
    PyObject *value = get(field, obj);
    if (value == NULL)
        return -1;
    int truth = PyObject_IsTrue(value);
    Py_DECREF(value);
    return truth < 0 ? -1 : put_bool(b, truth);
}

/* payload_size, payload, acl_name */
static int put_body(Recorder *self, Buffer *b, PyObject *message) {
    PyObject *payload = get(&M_PAYLOAD, message);
    if (payload == NULL)
        return -1;
    int rc = put_payload(self, b, payload);
    Py_DECREF(payload);
    return rc < 0 ? -1 : put_attr(b, message, &M_ACL, put_str);
}

/* A publish's topic, qos, retain, payload_size, payload, acl_name. */
static int put_message(Recorder *self, Buffer *b, PyObject *message) {
    if (put_attr(b, message, &M_TOPIC, put_topic) < 0 ||
        put_attr(b, message, &M_QOS, put_int_object) < 0 || put_truth(b, message, &M_RETAIN) < 0)
        return -1;
    return put_body(self, b, message);
}

/* A delivery's qos, retain and persisted (seq >= 0): a receiver's or an item's last three. */
static int put_flags(Buffer *b, PyObject *delivery) {
    if (put_attr(b, delivery, &D_QOS, put_int_object) < 0 || put_truth(b, delivery, &D_RETAIN) < 0)
        return -1;
    PyObject *seq = get(&D_SEQ, delivery);
    if (seq == NULL)
        return -1;
    long long stored = PyLong_AsLongLong(seq);
    Py_DECREF(seq);
    if (stored == -1 && PyErr_Occurred())
        return -1;
    return put_bool(b, stored >= 0);
}

/* -- records ---------------------------------------------------------------------------- */

static int schedule_turn_end(Recorder *self) {
    if (self->end_due)
        return 0;
    if (self->turn_ended == NULL &&
        (self->turn_ended = PyObject_GetAttr((PyObject *)self, s_turn_ended)) == NULL)
        return -1;
    PyObject *result = PyObject_CallOneArg(self->schedule, self->turn_ended);
    if (result == NULL)
        return -1;
    Py_DECREF(result);
    self->end_due = 1;
    return 0;
}

/* The pending records go to the log, in one call. */
static int hand_over(Recorder *self) {
    Py_ssize_t n = PyList_GET_SIZE(self->pending);
    if (n == 0)
        return 0;
    PyObject *fresh = PyList_New(0);
    if (fresh == NULL)
        return -1;
    PyObject *records = self->pending;
    self->pending = fresh;
    PyObject *codes = PyBytes_FromStringAndSize(self->pending_codes.data, self->pending_codes.size);
    PyObject *starts =
        PyBytes_FromStringAndSize(self->pending_starts.data, self->pending_starts.size);
    PyObject *size = PyLong_FromSsize_t(self->pending_size);
    PyObject *next_seq = PyLong_FromUnsignedLongLong(self->next_seq);
    self->pending_codes.size = self->pending_starts.size = self->pending_size = 0;
    PyObject *result = NULL;
    if (codes != NULL && starts != NULL && size != NULL && next_seq != NULL) {
        PyObject *args[5] = {codes, records, starts, size, next_seq};
        result = PyObject_Vectorcall(self->append_records, args, 5, NULL);
    }
    Py_DECREF(records);
    Py_XDECREF(codes);
    Py_XDECREF(starts);
    Py_XDECREF(size);
    Py_XDECREF(next_seq);
    if (result == NULL)
        return -1;
    Py_DECREF(result);
    return 0;
}

/* A record made: numbered (its sequence number written in), then pending. */
static int keep(Recorder *self, int code, Buffer *b, Py_ssize_t count) {
    if (PyList_GET_SIZE(self->pending) == 0) {
        PyObject *next_seq = PyObject_GetAttr(self->log, s_next_seq);
        if (next_seq == NULL)
            return -1;
        self->next_seq = PyLong_AsUnsignedLongLong(next_seq);
        Py_DECREF(next_seq);
        if (self->next_seq == (unsigned long long)-1 && PyErr_Occurred())
            return -1;
        if (schedule_turn_end(self) < 0)
            return -1;
    }
    big_endian((unsigned char *)b->data + SEQ_AT, self->next_seq, 8);
    PyObject *data = PyBytes_FromStringAndSize(b->data, b->size);
    b->size = 0;
    if (data == NULL)
        return -1;
    int rc = PyList_Append(self->pending, data);
    self->pending_size += PyBytes_GET_SIZE(data);
    Py_DECREF(data);
    long long start = (long long)self->next_seq;
    if (rc < 0 || put_byte(&self->pending_codes, (unsigned char)code) < 0 ||
        put(&self->pending_starts, &start, sizeof(start)) < 0)
        return -1;
    self->next_seq += count;
    return PyList_GET_SIZE(self->pending) >= PENDING_MAX ? hand_over(self) : 0;
}

/* The open run goes to the log. */
static int close_run(Recorder *self) {
    Buffer *b = &self->buffer;
    int code = self->code;
    self->code = 0;
    Py_CLEAR(self->message);
    Py_CLEAR(self->who);
    Py_ssize_t count = self->receivers;
    if (count == 0 && code != PUBLISH_DELIVERIES) { /* its first one failed: nothing to say */
        b->size = 0;
        return 0;
    }
    if (count == 0) { /* a publish that reached no one (now): a plain on_publish */
        b->data[2] = 14;
        b->data[CODE_AT] = ON_PUBLISH;
        b->size = self->count_at - 1;
        return keep(self, ON_PUBLISH, b, 1);
    }
    big_endian((unsigned char *)b->data + self->count_at, count, 4);
    big_endian((unsigned char *)b->data + self->receivers_at - 4, b->size - self->receivers_at, 4);
    return keep(self, code, b, count + (code == PUBLISH_DELIVERIES));
}

/* The run's last two fields: the receiver (item) count (uint 32) and the receivers (bin
 * 32), both written when the run ends. `message`: a message run's, or NULL. */
static int open_run(Recorder *self, PyObject *message, int code) {
    Buffer *b = &self->buffer;
    if (put_head(b, 0xce, 0, 4) < 0)
        return -1;
    self->count_at = b->size - 4;
    if (put_head(b, 0xc6, 0, 4) < 0)
        return -1;
    self->receivers_at = b->size;
    Py_XINCREF(message);
    self->message = message;
    self->code = code;
    self->receivers = 0;
    return schedule_turn_end(self); /* a run ends with the loop turn at the latest */
}

static int end_run(Recorder *self) { return self->code ? close_run(self) : 0; }

/* Everything recorded goes to the log now. */
static int seal_run(Recorder *self) { return end_run(self) < 0 ? -1 : hand_over(self); }

/* -- hooks.MessageRecorder ---------------------------------------------------------------- */

/* A client's or session's first four fields as a receiver has them (an array 7 header,
 * then client_id, mountpoint, username, session_id), encoded once per connection. */
static PyObject *identity_of(Recorder *self, PyObject *who, Field **fields) {
    PyObject *session_id = get(fields[3], who);
    if (session_id == NULL)
        return NULL;
    PyObject *identity = PyDict_GetItemWithError(self->identities, session_id);
    if (identity != NULL || PyErr_Occurred()) {
        Py_DECREF(session_id);
        Py_XINCREF(identity);
        return identity;
    }
    Buffer b = {NULL, 0, 0};
    if (put_byte(&b, 0x97) < 0 || put_identity(&b, who, fields) < 0) {
        PyMem_Free(b.data);
        Py_DECREF(session_id);
        return NULL;
    }
    identity = PyBytes_FromStringAndSize(b.data, b.size);
    PyMem_Free(b.data);
    if (identity != NULL) {
        if (PyDict_GET_SIZE(self->identities) >= IDENTITIES_KEPT)
            PyDict_Clear(self->identities);
        if (PyDict_SetItem(self->identities, session_id, identity) < 0)
            Py_CLEAR(identity);
    }
    Py_DECREF(session_id);
    return identity;
}

/* The identity's four fields, without the receiver's array header. */
static int put_who(Recorder *self, Buffer *b, PyObject *who, Field **fields) {
    PyObject *identity = identity_of(self, who, fields);
    if (identity == NULL)
        return -1;
    int rc = put(b, PyBytes_AS_STRING(identity) + 1, PyBytes_GET_SIZE(identity) - 1);
    Py_DECREF(identity);
    return rc;
}

/* A run's delivery's flags (published_run): QoS 0, not retained, not stored. */
static const char RUN_FLAGS[3] = {0x00, (char)0xc2, (char)0xc2};

/* One more receiver of the open message run, whose encoded identity is `identity` (taken
 * back if it fails halfway); with `delivery` NULL, of a run's message (RUN_FLAGS). */
static int add_identity(Recorder *self, PyObject *identity, PyObject *delivery) {
    Buffer *b = &self->buffer;
    Py_ssize_t before = b->size;
    int rc = put(b, PyBytes_AS_STRING(identity), PyBytes_GET_SIZE(identity));
    Py_ssize_t flags_at = b->size;
    if (rc < 0 || (delivery == NULL ? put(b, RUN_FLAGS, 3) : put_flags(b, delivery)) < 0) {
        b->size = before;
        return -1;
    }
    self->flags_at = flags_at;
    self->receivers++;
    return 0;
}

static int add_receiver(Recorder *self, PyObject *session, PyObject *delivery) {
    PyObject *identity = identity_of(self, session, RECEIVER);
    if (identity == NULL)
        return -1;
    int rc = add_identity(self, identity, delivery);
    Py_DECREF(identity);
    return rc;
}

/* One more item of the open session run: an array of 8, the event's code, the message's
 * topic, payload_size, payload, acl_name, then the delivery's flags (taken back if it
 * fails halfway). */
static int add_item(Recorder *self, int code, PyObject *delivery) {
    Buffer *b = &self->buffer;
    Py_ssize_t before = b->size;
    PyObject *message = get(&D_MESSAGE, delivery);
    if (message == NULL)
        return -1;
    int rc = (put_byte(b, 0x98) < 0 || put_byte(b, (unsigned char)code) < 0 ||
              put_attr(b, message, &M_TOPIC, put_topic) < 0 || put_body(self, b, message) < 0 ||
              put_flags(b, delivery) < 0)
                 ? -1
                 : 0;
    Py_DECREF(message);
    if (rc < 0) {
        b->size = before;
        return -1;
    }
    self->receivers++;
    return 0;
}

/* A SESSION_EVENTS run of `session` (whose session id is `session_id`) opens. */
static int open_session_run(Recorder *self, PyObject *session, PyObject *session_id) {
    Buffer *b = &self->buffer;
    b->size = 0;
    if (put_start(b, 9, SESSION_EVENTS) < 0 || put_who(self, b, session, RECEIVER) < 0 ||
        open_run(self, NULL, SESSION_EVENTS) < 0) {
        b->size = 0;
        self->code = 0;
        return -1;
    }
    Py_INCREF(session_id);
    self->who = session_id;
    return 0;
}

/* The open DELIVERIES run of one receiver becomes that receiver's SESSION_EVENTS run, its
 * delivery the first item: the same bytes, rearranged (the run's ts is kept). */
static int to_session_run(Recorder *self) {
    Buffer *from = &self->buffer, *to = &self->scratch;
    Py_ssize_t identity_at = self->receivers_at + 1; /* after the receiver's array header */
    Py_ssize_t fields_at = CODE_AT + 1, fields_end = self->count_at - 1; /* topic..acl_name */
    to->size = 0;
    if (put_start(to, 9, SESSION_EVENTS) < 0)
        return -1;
    memcpy(to->data + SEQ_AT + 9, from->data + SEQ_AT + 9, 8);
    if (put(to, from->data + identity_at, self->flags_at - identity_at) < 0 ||
        put_head(to, 0xce, 0, 4) < 0)
        return -1;
    Py_ssize_t count_at = to->size - 4;
    if (put_head(to, 0xc6, 0, 4) < 0)
        return -1;
    Py_ssize_t receivers_at = to->size;
    if (put_byte(to, 0x98) < 0 || put_byte(to, ON_DELIVER) < 0 ||
        put(to, from->data + fields_at, fields_end - fields_at) < 0 ||
        put(to, from->data + self->flags_at, from->size - self->flags_at) < 0)
        return -1;
    Buffer swap = *from;
    *from = *to;
    *to = swap;
    self->count_at = count_at;
    self->receivers_at = receivers_at;
    self->code = SESSION_EVENTS;
    Py_CLEAR(self->message);
    return 0;
}

static PyObject *Recorder_published(Recorder *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "published(client, message, matched_acl)");
        return NULL;
    }
    PyObject *client = args[0], *message = args[1], *matched = args[2];
    if (end_run(self) < 0)
        return NULL;
    if (!self->publish)
        Py_RETURN_NONE;
    Buffer *b = &self->buffer;
    b->size = 0;
    if (put_start(b, 16, PUBLISH_DELIVERIES) < 0 || put_who(self, b, client, PUBLISHER) < 0 ||
        put_message(self, b, message) < 0)
        goto fail;
    if (matched == Py_None) {
        if (put_byte(b, 0xa0) < 0)
            goto fail;
    } else if (put_attr(b, matched, &A_PATTERN, put_str) < 0) {
        goto fail;
    }
    if (open_run(self, message, PUBLISH_DELIVERIES) < 0)
        goto fail;
    if (!self->deliver && close_run(self) < 0) /* alone: a plain on_publish */
        return NULL;
    Py_RETURN_NONE;
fail:
    Py_CLEAR(self->message);
    self->code = 0;
    b->size = 0;
    return NULL;
}

static PyObject *Recorder_delivered(Recorder *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "delivered(session, delivery)");
        return NULL;
    }
    if (!self->deliver)
        Py_RETURN_NONE;
    PyObject *session = args[0], *delivery = args[1];
    PyObject *message = get(&D_MESSAGE, delivery);
    if (message == NULL)
        return NULL;
    if (self->code && message == self->message) { /* this message's run: one more receiver */
        Py_DECREF(message);
        Py_CLEAR(self->who); /* not one receiver's any more */
        if (add_receiver(self, session, delivery) < 0)
            return NULL;
        Py_RETURN_NONE;
    }
    PyObject *session_id = get(&R_SESSION_ID, session);
    if (session_id == NULL) {
        Py_DECREF(message);
        return NULL;
    }
    if (self->code && session_id == self->who) { /* this receiver's run */
        Py_DECREF(session_id);
        Py_DECREF(message);
        if ((self->code == DELIVERIES && to_session_run(self) < 0) ||
            add_item(self, ON_DELIVER, delivery) < 0)
            return NULL;
        Py_RETURN_NONE;
    }
    Buffer *b = &self->buffer;
    if (end_run(self) < 0)
        goto fail;
    b->size = 0;
    if (put_start(b, 9, DELIVERIES) < 0 || put_attr(b, message, &M_TOPIC, put_topic) < 0 ||
        put_body(self, b, message) < 0 || open_run(self, message, DELIVERIES) < 0) {
        b->size = 0;
        Py_CLEAR(self->message);
        self->code = 0;
        goto fail;
    }
    Py_DECREF(message);
    if (add_receiver(self, session, delivery) < 0) {
        Py_DECREF(session_id);
        return NULL;
    }
    self->who = session_id; /* one receiver so far: the run's reference now */
    Py_RETURN_NONE;
fail:
    Py_DECREF(message);
    Py_DECREF(session_id);
    return NULL;
}

static PyObject *Recorder_completed(Recorder *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "completed(session, delivery)");
        return NULL;
    }
    if (!self->complete)
        Py_RETURN_NONE;
    PyObject *session = args[0], *delivery = args[1];
    PyObject *session_id = get(&R_SESSION_ID, session);
    if (session_id == NULL)
        return NULL;
    int rc;
    if (self->code && session_id == self->who) /* this receiver's run */
        rc = self->code == DELIVERIES ? to_session_run(self) : 0;
    else
        rc = end_run(self) < 0 ? -1 : open_session_run(self, session, session_id);
    Py_DECREF(session_id);
    if (rc < 0 || add_item(self, ON_DELIVERY_COMPLETE, delivery) < 0)
        return NULL;
    Py_RETURN_NONE;
}

/* A run's ACL rule, encoded: its label (a message's acl_name) and its pattern; "" and ""
 * without one. */
typedef struct {
    Buffer name;
    Buffer pattern;
} RunAcl;

static int encode_run_acl(RunAcl *acl, PyObject *matched) {
    if (matched == Py_None)
        return put_byte(&acl->name, 0xa0) < 0 || put_byte(&acl->pattern, 0xa0) < 0 ? -1 : 0;
    return put_attr(&acl->name, matched, &A_NAME, put_str) < 0 ||
                   put_attr(&acl->pattern, matched, &A_PATTERN, put_str) < 0
               ? -1
               : 0;
}

/* published_run's work, on its payloads and receivers as fast sequences. `identities`:
 * one place per receiver for its encoded identity, looked up at its first delivery and
 * reused for the run's next messages (a fan-out's cost is per delivery). */
static int record_run(Recorder *self, PyObject *client, PyObject *topic, PyObject *payloads,
                      PyObject *receivers, RunAcl *acl, PyObject **identities) {
    Buffer *b = &self->buffer;
    for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(payloads); i++) {
        PyObject *payload = PySequence_Fast_GET_ITEM(payloads, i);
        if (end_run(self) < 0)
            return -1;
        b->size = 0;
        if (self->publish) {
            if (put_start(b, 16, PUBLISH_DELIVERIES) < 0 ||
                put_who(self, b, client, PUBLISHER) < 0 || put_str(b, topic) < 0 ||
                put_byte(b, 0) < 0 || put_bool(b, 0) < 0 || put_payload(self, b, payload) < 0 ||
                put(b, acl->name.data, acl->name.size) < 0 ||
                put(b, acl->pattern.data, acl->pattern.size) < 0 ||
                open_run(self, NULL, PUBLISH_DELIVERIES) < 0)
                goto fail;
            if (!self->deliver) {
                if (close_run(self) < 0) /* alone: a plain on_publish */
                    return -1;
                continue;
            }
        }
        if (!self->deliver)
            continue;
        for (Py_ssize_t j = 0; j < PySequence_Fast_GET_SIZE(receivers); j++) {
            PyObject *receiver = PySequence_Fast_GET_ITEM(receivers, j);
            if (self->code == 0 &&
                (put_start(b, 9, DELIVERIES) < 0 || put_str(b, topic) < 0 ||
                 put_payload(self, b, payload) < 0 || put(b, acl->name.data, acl->name.size) < 0 ||
                 open_run(self, NULL, DELIVERIES) < 0))
                goto fail;
            if (identities[j] == NULL &&
                (identities[j] = identity_of(self, receiver, RECEIVER)) == NULL)
                return -1;
            if (add_identity(self, identities[j], NULL) < 0)
                return -1;
            /* A DELIVERIES run knows its receiver while it has one (Recorder_delivered). */
            Py_CLEAR(self->who);
            if (self->code == DELIVERIES && self->receivers == 1 &&
                (self->who = get(&R_SESSION_ID, receiver)) == NULL)
                return -1;
        }
    }
    return 0;
fail:
    self->code = 0;
    b->size = 0;
    return -1;
}

/* published_run(client, topic, payloads, receivers, matched_acl): for each payload, what
 * published() then delivered() to each receiver record (hooks/recorder.py), from the run's
 * own values: the message's qos 0, unretained, its ACL label and pattern matched_acl's (""
 * without one); each delivery RUN_FLAGS. As published() does, each message ends the open
 * run first, so a message's deliveries always open a run of their own (or join its
 * publish's). */
static PyObject *Recorder_published_run(Recorder *self, PyObject *const *args,
                                        Py_ssize_t nargs) {
    if (nargs != 5 || !PyUnicode_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError,
                        "published_run(client, topic: str, payloads, receivers, matched_acl)");
        return NULL;
    }
    PyObject *client = args[0], *topic = args[1];
    PyObject *payloads = PySequence_Fast(args[2], "payloads must be a sequence");
    if (payloads == NULL)
        return NULL;
    PyObject *receivers = PySequence_Fast(args[3], "receivers must be a sequence");
    if (receivers == NULL) {
        Py_DECREF(payloads);
        return NULL;
    }
    Py_ssize_t count = PySequence_Fast_GET_SIZE(receivers);
    PyObject **identities = PyMem_Calloc(count ? count : 1, sizeof(PyObject *));
    RunAcl acl = {{NULL, 0, 0}, {NULL, 0, 0}};
    int rc = -1;
    if (identities == NULL)
        PyErr_NoMemory();
    else if (encode_run_acl(&acl, args[4]) == 0)
        rc = record_run(self, client, topic, payloads, receivers, &acl, identities);
    for (Py_ssize_t j = 0; identities != NULL && j < count; j++)
        Py_XDECREF(identities[j]);
    PyMem_Free(identities);
    PyMem_Free(acl.name.data);
    PyMem_Free(acl.pattern.data);
    Py_DECREF(payloads);
    Py_DECREF(receivers);
    if (rc < 0)
        return NULL;
    Py_RETURN_NONE;
}

/* -- the other events, and the end of a run --------------------------------------------- */

static PyObject *Recorder_append(Recorder *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "append(code, values)");
        return NULL;
    }
    if (seal_run(self) < 0)
        return NULL;
    PyObject *result = PyObject_Vectorcall(self->append_event, args, nargs, NULL);
    if (result == NULL)
        return NULL;
    Py_DECREF(result);
    Py_RETURN_NONE;
}

static PyObject *Recorder_seal(Recorder *self, PyObject *unused) {
    if (seal_run(self) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *Recorder_turn_ended(Recorder *self, PyObject *unused) {
    self->end_due = 0;
    return Recorder_seal(self, NULL);
}

/* -- the type ----------------------------------------------------------------------------- */

static int Recorder_init(Recorder *self, PyObject *args, PyObject *kwargs) {
    static char *names[] = {"log", "relayed", "payloads", "sample", "schedule", NULL};
    PyObject *log, *relayed, *payloads_obj, *sample, *schedule;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOUOO", names, &log, &relayed, &payloads_obj,
                                     &sample, &schedule))
        return -1;
    int sampled = PyObject_IsTrue(sample);
    if (sampled < 0)
        return -1;
    if (sampled) {
        PyErr_SetString(PyExc_ValueError, "sampling rules are applied by recorder.Recorder");
        return -1;
    }
    const char *payloads = PyUnicode_AsUTF8(payloads_obj);
    if (payloads == NULL)
        return -1;
    int flags[3];
    const char *hooks[3] = {"on_publish", "on_deliver", "on_delivery_complete"};
    for (int i = 0; i < 3; i++) {
        PyObject *hook = PyUnicode_FromString(hooks[i]);
        if (hook == NULL)
            return -1;
        flags[i] = PySequence_Contains(relayed, hook);
        Py_DECREF(hook);
        if (flags[i] < 0)
            return -1;
    }
    self->publish = flags[0];
    self->deliver = flags[1];
    self->complete = flags[2];
    self->full = strcmp(payloads, "full") == 0;
    self->sizes = strcmp(payloads, "none") != 0;
    PyObject *append_event = PyObject_GetAttrString(log, "append");
    PyObject *append_records = PyObject_GetAttrString(log, "append_records");
    PyObject *identities = PyDict_New();
    PyObject *pending = PyList_New(0);
    if (append_event == NULL || append_records == NULL ||
        identities == NULL || pending == NULL) {
        Py_XDECREF(append_event);
        Py_XDECREF(append_records);
        Py_XDECREF(identities);
        Py_XDECREF(pending);
        return -1;
    }
    Py_INCREF(log);
    Py_INCREF(schedule);
    Py_XSETREF(self->log, log);
    Py_XSETREF(self->schedule, schedule);
    Py_XSETREF(self->append_event, append_event);
    Py_XSETREF(self->identities, identities);
    Py_XSETREF(self->append_records, append_records);
    Py_XSETREF(self->pending, pending);
    return 0;
}

static int Recorder_traverse(Recorder *self, visitproc visit, void *arg) {
    Py_VISIT(self->log);
    Py_VISIT(self->append_event);
    Py_VISIT(self->schedule);
    Py_VISIT(self->identities);
    Py_VISIT(self->message);
    Py_VISIT(self->who);
    Py_VISIT(self->append_records);
    Py_VISIT(self->pending);
    Py_VISIT(self->turn_ended);
    return 0;
}

static int Recorder_clear(Recorder *self) {
    Py_CLEAR(self->log);
    Py_CLEAR(self->append_event);
    Py_CLEAR(self->schedule);
    Py_CLEAR(self->identities);
    Py_CLEAR(self->message);
    Py_CLEAR(self->who);
    Py_CLEAR(self->append_records);
    Py_CLEAR(self->pending);
    Py_CLEAR(self->turn_ended);
    return 0;
}

static void Recorder_dealloc(Recorder *self) {
    PyObject_GC_UnTrack(self);
    Recorder_clear(self);
    PyMem_Free(self->buffer.data);
    PyMem_Free(self->scratch.data);
    PyMem_Free(self->pending_codes.data);
    PyMem_Free(self->pending_starts.data);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *Recorder_get_sampled_out(Recorder *self, void *closure) { return PyLong_FromLong(0); }

static PyMethodDef Recorder_methods[] = {
    {"published", (PyCFunction)(void (*)(void))Recorder_published, METH_FASTCALL, NULL},
    {"delivered", (PyCFunction)(void (*)(void))Recorder_delivered, METH_FASTCALL, NULL},
    {"completed", (PyCFunction)(void (*)(void))Recorder_completed, METH_FASTCALL, NULL},
    {"published_run", (PyCFunction)(void (*)(void))Recorder_published_run, METH_FASTCALL, NULL},
    {"append", (PyCFunction)(void (*)(void))Recorder_append, METH_FASTCALL,
     "Any other event: the open run is recorded first."},
    {"seal", (PyCFunction)Recorder_seal, METH_NOARGS, "Record the open run now."},
    {"_turn_ended", (PyCFunction)Recorder_turn_ended, METH_NOARGS, NULL},
    {NULL},
};

static PyMemberDef Recorder_members[] = {
    {"schedule", T_OBJECT_EX, offsetof(Recorder, schedule), 0,
     "schedule(callback): call it once the loop turn ends"},
    {NULL},
};

static PyGetSetDef Recorder_getset[] = {
    {"sampled_out", (getter)Recorder_get_sampled_out, NULL, "always 0: no sampling here", NULL},
    {NULL},
};

static PyTypeObject RecorderType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "event_relay._recorder.Recorder",
    .tp_basicsize = sizeof(Recorder),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "event_relay.recorder.Recorder, in C (no sampling rules).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Recorder_init,
    .tp_dealloc = (destructor)Recorder_dealloc,
    .tp_traverse = (traverseproc)Recorder_traverse,
    .tp_clear = (inquiry)Recorder_clear,
    .tp_methods = Recorder_methods,
    .tp_getset = Recorder_getset,
    .tp_members = Recorder_members,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "event_relay._recorder", "event_relay.recorder.Recorder, in C.", -1,
};

PyMODINIT_FUNC PyInit__recorder(void) {
    for (size_t i = 0; i < sizeof(FIELDS) / sizeof(FIELDS[0]); i++) {
        FIELDS[i]->name = PyUnicode_InternFromString(FIELDS[i]->text);
        if (FIELDS[i]->name == NULL)
            return NULL;
    }
    s_next_seq = PyUnicode_InternFromString("next_seq");
    s_turn_ended = PyUnicode_InternFromString("_turn_ended");
    if (s_next_seq == NULL || s_turn_ended == NULL)
        return NULL;
    if (PyType_Ready(&RecorderType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    Py_INCREF(&RecorderType);
    if (PyModule_AddObject(m, "Recorder", (PyObject *)&RecorderType) < 0) {
        Py_DECREF(&RecorderType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
