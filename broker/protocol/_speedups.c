/* The codec's hot path in C: the packets a flood is made of, decoded in runs, and the
 * PUBLISH a subscriber is sent, made from the one received (publish_with_id).
 *
 * `decode_run` reads consecutive complete packets from the decoder's buffer and builds the
 * same objects the Python readers (_readers.py) build: PUBLISH, the four acknowledgements
 * in their short form (a packet id only), PINGREQ and PINGRESP. It decodes only what is
 * well formed and unremarkable; at the first packet that is anything else (another type,
 * MQTT 5 properties, bad flags, a topic that is not valid UTF-8, a packet over the size
 * limit, ...) it stops and returns, and the Python decoder reads that packet, so every
 * error is raised in one place, with one message (_decoder.py). Without a C compiler this
 * module is simply absent and the Python decoder does everything.
 *
 * The packet classes are slotted dataclasses: objects are allocated with tp_alloc and
 * their slots filled through the member descriptors, as their __init__ would (without
 * running Python code for each packet).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>

enum { PUBLISH = 3, PUBACK = 4, PUBREC = 5, PUBREL = 6, PUBCOMP = 7, PINGREQ = 12, PINGRESP = 13 };
enum { MQTT5 = 5 };

/* The fields of a PUBLISH, in Publish's order, and of the acknowledgements. */
enum { P_TOPIC, P_PAYLOAD, P_QOS, P_RETAIN, P_DUP, P_PACKET_ID, P_PROPERTIES, P_RAW, P_COUNT };
static const char *PUBLISH_FIELDS[P_COUNT] = {
    "topic", "payload", "qos", "retain", "dup", "packet_id", "properties", "raw"};
enum { A_PACKET_ID, A_REASON_CODE, A_PROPERTIES, A_COUNT };
static const char *ACK_FIELDS[A_COUNT] = {"packet_id", "reason_code", "properties"};

typedef struct {
    PyTypeObject *cls;
    PyObject *fields[P_COUNT]; /* member descriptors; an ack uses the first A_COUNT */
} PacketClass;

/* Indexed by packet type; a NULL cls: not decoded here. */
static PacketClass classes[16];
static PyObject *small_ints[4]; /* 0..3: qos values, reason code 0 */

static int
set_field(PyObject *descr, PyObject *obj, PyObject *value)
{
    return Py_TYPE(descr)->tp_descr_set(descr, obj, value);
}

static int
load_class(int type, PyObject *cls, const char **names, int count)
{
    if (!PyType_Check(cls)) {
        PyErr_Format(PyExc_TypeError, "packet class for type %d is not a class", type);
        return -1;
    }
    PacketClass *entry = &classes[type];
    Py_INCREF(cls);
    entry->cls = (PyTypeObject *)cls;
    for (int i = 0; i < count; i++) {
        PyObject *descr = PyObject_GetAttrString(cls, names[i]);
        if (descr == NULL)
            return -1;
        if (Py_TYPE(descr)->tp_descr_set == NULL) {
            PyErr_Format(PyExc_TypeError, "%R.%s is not a slot", cls, names[i]);
            Py_DECREF(descr);
            return -1;
        }
        entry->fields[i] = descr;
    }
    return 0;
}

static PyObject *
setup(PyObject *Py_UNUSED(self), PyObject *args)
{
    PyObject *publish, *puback, *pubrec, *pubrel, *pubcomp, *pingreq, *pingresp;
    if (!PyArg_ParseTuple(args, "OOOOOOO", &publish, &puback, &pubrec, &pubrel, &pubcomp,
                          &pingreq, &pingresp))
        return NULL;
    if (classes[PUBLISH].cls != NULL)
        Py_RETURN_NONE; /* once per process */
    if (load_class(PUBLISH, publish, PUBLISH_FIELDS, P_COUNT) < 0 ||
        load_class(PUBACK, puback, ACK_FIELDS, A_COUNT) < 0 ||
        load_class(PUBREC, pubrec, ACK_FIELDS, A_COUNT) < 0 ||
        load_class(PUBREL, pubrel, ACK_FIELDS, A_COUNT) < 0 ||
        load_class(PUBCOMP, pubcomp, ACK_FIELDS, A_COUNT) < 0 ||
        load_class(PINGREQ, pingreq, NULL, 0) < 0 || load_class(PINGRESP, pingresp, NULL, 0) < 0)
        return NULL;
    for (int i = 0; i < 4; i++)
        small_ints[i] = PyLong_FromLong(i);
    Py_RETURN_NONE;
}

/* The flags the fixed header must carry [MQTT-2.1.3-1]; PUBLISH's are checked apart. */
static int
flags_ok(int type, int flags)
{
    return flags == (type == PUBREL ? 2 : 0);
}

/* `obj`, or NULL with an exception set when building it failed (it is released). */
static PyObject *
built(PyObject *obj, int failed)
{
    if (!failed)
        return obj;
    Py_XDECREF(obj);
    if (!PyErr_Occurred())
        PyErr_NoMemory();
    return NULL;
}

/* The previous PUBLISH's topic in this run: a run to one topic shares one string (and
 * its cached hash). Its bytes point into the buffer, which does not change during a run. */
typedef struct {
    PyObject *text;
    const char *data;
    Py_ssize_t size;
} LastTopic;

/* A topic as _buffer.decode_utf8 accepts it, or NULL (no exception set): the Python
 * decoder will read this packet and say what is wrong with it. */
static PyObject *
topic_of(const char *data, Py_ssize_t size, LastTopic *last)
{
    if (last->text != NULL && last->size == size && memcmp(last->data, data, size) == 0)
        return Py_NewRef(last->text);
    if (memchr(data, 0, size) != NULL)
        return NULL;
    PyObject *topic = PyUnicode_DecodeUTF8(data, size, "strict");
    if (topic == NULL) {
        PyErr_Clear();
        return NULL;
    }
    Py_XDECREF(last->text);
    last->text = Py_NewRef(topic);
    last->data = data;
    last->size = size;
    return topic;
}

/* One PUBLISH from its whole packet (`packet`, `size` bytes, body at `body`), or NULL:
 * with an exception set when Python failed us, without one when the Python decoder must
 * read it. */
static PyObject *
read_publish(const unsigned char *packet, Py_ssize_t size, Py_ssize_t body, int flags,
             int level, LastTopic *last_topic)
{
    int qos = (flags >> 1) & 3;
    int dup = flags & 8;
    if (qos == 3 || (dup && !qos))
        return NULL;
    Py_ssize_t pos = body + 2;
    if (pos > size)
        return NULL;
    Py_ssize_t topic_end = pos + ((packet[body] << 8) | packet[body + 1]);
    if (topic_end > size)
        return NULL;
    long packet_id = -1;
    Py_ssize_t rest = topic_end;
    if (qos) {
        if (rest + 2 > size)
            return NULL;
        packet_id = (packet[rest] << 8) | packet[rest + 1];
        if (packet_id == 0)
            return NULL;
        rest += 2;
    }
    if (level == MQTT5) {
        if (rest >= size || packet[rest] != 0)
            return NULL; /* properties: read in Python */
        rest += 1;
    }
    PyObject *topic = topic_of((const char *)packet + pos, topic_end - pos, last_topic);
    if (topic == NULL)
        return NULL;
    PacketClass *c = &classes[PUBLISH];
    PyObject *obj = c->cls->tp_alloc(c->cls, 0);
    PyObject *raw = PyBytes_FromStringAndSize((const char *)packet, size);
    PyObject *payload = PyBytes_FromStringAndSize((const char *)packet + rest, size - rest);
    PyObject *id = packet_id < 0 ? Py_NewRef(Py_None) : PyLong_FromLong(packet_id);
    PyObject *props = PyDict_New();
    int failed = obj == NULL || raw == NULL || payload == NULL || id == NULL || props == NULL ||
                 set_field(c->fields[P_TOPIC], obj, topic) < 0 ||
                 set_field(c->fields[P_PAYLOAD], obj, payload) < 0 ||
                 set_field(c->fields[P_QOS], obj, small_ints[qos]) < 0 ||
                 set_field(c->fields[P_RETAIN], obj, flags & 1 ? Py_True : Py_False) < 0 ||
                 set_field(c->fields[P_DUP], obj, dup ? Py_True : Py_False) < 0 ||
                 set_field(c->fields[P_PACKET_ID], obj, id) < 0 ||
                 set_field(c->fields[P_PROPERTIES], obj, props) < 0 ||
                 set_field(c->fields[P_RAW], obj, raw) < 0;
    Py_DECREF(topic);
    Py_XDECREF(raw);
    Py_XDECREF(payload);
    Py_XDECREF(id);
    Py_XDECREF(props);
    return built(obj, failed);
}

/* An acknowledgement with a packet id and nothing else (reason code 0, no properties). */
static PyObject *
read_ack(int type, const unsigned char *body, Py_ssize_t length)
{
    if (length != 2)
        return NULL; /* a reason code or properties (MQTT 5): read in Python */
    long packet_id = (body[0] << 8) | body[1];
    PacketClass *c = &classes[type];
    PyObject *obj = c->cls->tp_alloc(c->cls, 0);
    PyObject *id = PyLong_FromLong(packet_id);
    PyObject *props = PyDict_New();
    int failed = obj == NULL || id == NULL || props == NULL ||
                 set_field(c->fields[A_PACKET_ID], obj, id) < 0 ||
                 set_field(c->fields[A_REASON_CODE], obj, small_ints[0]) < 0 ||
                 set_field(c->fields[A_PROPERTIES], obj, props) < 0;
    Py_XDECREF(id);
    Py_XDECREF(props);
    return built(obj, failed);
}

/* decode_run(buffer, pos, level, allowed, max_packet_size, limit) -> (packets, pos)
 *
 * At most `limit` packets from `buffer` (a bytearray) at `pos`, of types in the bit mask
 * `allowed`, in reverse order (the decoder pops them from the end), and the position after
 * the last one. Stops early at an incomplete packet and at one the Python decoder must
 * read. */
static PyObject *
decode_run(PyObject *Py_UNUSED(self), PyObject *args)
{
    PyObject *buffer;
    Py_ssize_t pos, max_packet_size, limit;
    int level;
    unsigned long allowed;
    if (!PyArg_ParseTuple(args, "O!niknn", &PyByteArray_Type, &buffer, &pos, &level, &allowed,
                          &max_packet_size, &limit))
        return NULL;
    if (classes[PUBLISH].cls == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "_speedups.setup() was not called");
        return NULL;
    }
    const unsigned char *buf = (const unsigned char *)PyByteArray_AS_STRING(buffer);
    Py_ssize_t end = PyByteArray_GET_SIZE(buffer);
    PyObject *packets = PyList_New(0);
    if (packets == NULL)
        return NULL;
    LastTopic last_topic = {NULL, NULL, 0};
    while (PyList_GET_SIZE(packets) < limit && end - pos >= 2) {
        int type = buf[pos] >> 4;
        int flags = buf[pos] & 0x0F;
        if (classes[type].cls == NULL || !(allowed & (1UL << type)))
            break;
        if (type != PUBLISH && !flags_ok(type, flags))
            break;
        Py_ssize_t length = 0, i = pos + 1;
        int shift = 0, complete = 0;
        while (i < end && shift < 28) {
            unsigned char byte = buf[i++];
            length |= (Py_ssize_t)(byte & 0x7F) << shift;
            if (!(byte & 0x80)) {
                complete = 1;
                break;
            }
            shift += 7;
        }
        if (!complete || i - pos + length > max_packet_size || end - i < length)
            break; /* incomplete, malformed or too large: the Python decoder decides */
        PyObject *packet;
        if (type == PUBLISH)
            packet = read_publish(buf + pos, i - pos + length, i - pos, flags, level, &last_topic);
        else if (type == PINGREQ || type == PINGRESP)
            packet = length == 0 ? classes[type].cls->tp_alloc(classes[type].cls, 0) : NULL;
        else
            packet = read_ack(type, buf + i, length);
        if (packet == NULL) {
            if (PyErr_Occurred()) {
                Py_XDECREF(last_topic.text);
                Py_DECREF(packets);
                return NULL;
            }
            break;
        }
        int appended = PyList_Append(packets, packet);
        Py_DECREF(packet);
        if (appended < 0) {
            Py_XDECREF(last_topic.text);
            Py_DECREF(packets);
            return NULL;
        }
        pos = i + length;
    }
    Py_XDECREF(last_topic.text);
    if (PyList_Reverse(packets) < 0) {
        Py_DECREF(packets);
        return NULL;
    }
    return Py_BuildValue("(Nn)", packets, pos);
}

/* publish_with_id(packet, packet_id, retain) -> bytes: _writers.publish_with_id. */
static PyObject *
publish_with_id(PyObject *Py_UNUSED(self), PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3 || !PyBytes_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "publish_with_id(packet: bytes, packet_id, retain)");
        return NULL;
    }
    long packet_id = PyLong_AsLong(args[1]);
    if (packet_id == -1 && PyErr_Occurred())
        return NULL;
    int retain = PyObject_IsTrue(args[2]);
    if (retain < 0)
        return NULL;
    const unsigned char *packet = (const unsigned char *)PyBytes_AS_STRING(args[0]);
    Py_ssize_t size = PyBytes_GET_SIZE(args[0]);
    Py_ssize_t header = 2;
    while (header <= 5 && header - 1 < size && (packet[header - 1] & 0x80))
        header++;
    if (header + 2 > size) {
        PyErr_SetString(PyExc_ValueError, "not a PUBLISH with a packet id");
        return NULL;
    }
    Py_ssize_t at = header + 2 + ((packet[header] << 8) | packet[header + 1]);
    if (at + 2 > size) {
        PyErr_SetString(PyExc_ValueError, "not a PUBLISH with a packet id");
        return NULL;
    }
    PyObject *out = PyBytes_FromStringAndSize((const char *)packet, size);
    if (out == NULL)
        return NULL;
    unsigned char *bytes = (unsigned char *)PyBytes_AS_STRING(out);
    bytes[0] = (bytes[0] & 0xF6) | (retain ? 1 : 0);
    bytes[at] = (unsigned char)(packet_id >> 8);
    bytes[at + 1] = (unsigned char)(packet_id & 0xFF);
    return out;
}

static PyMethodDef methods[] = {
    {"setup", setup, METH_VARARGS,
     "setup(Publish, PubAck, PubRec, PubRel, PubComp, PingReq, PingResp): the classes to build"},
    {"decode_run", decode_run, METH_VARARGS,
     "decode_run(buffer, pos, level, allowed, max_packet_size, limit) -> (packets, pos)"},
    {"publish_with_id", (PyCFunction)(void (*)(void))publish_with_id, METH_FASTCALL,
     "publish_with_id(packet, packet_id, retain) -> bytes"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_speedups", "The MQTT codec's hot path in C.", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC
PyInit__speedups(void)
{
    return PyModule_Create(&module);
}
