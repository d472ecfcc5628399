/* The L1 table: every L1 entry in RAM, with its LRU order, deadline, byte accounting and
 * dirty mark, and the pipelined plain path that serves a read of plain commands without
 * building a Python object per command.
 *
 * Why C. With 100k random keys a Python OrderedDict costs four or five hash probes per SET
 * (get, set, move_to_end, the dirty set), each a cache miss, plus the interpreter's work per
 * command; profiles showed dict lookups alone at a quarter of the daemon's CPU. Here an
 * entry is one 24-byte slot found with one probe of an index array, the LRU list links
 * slots by number, and `run` parses RESP straight from the read buffer.
 *
 * Memory layout (what one entry costs; 1M keys of 13 bytes with 15-byte values measured
 * 221-224 MiB of daemon RSS when key and value were two Python bytes objects in a 48-byte
 * slot, 142 MiB with this layout, redis-server 120 MiB; see docs/BENCHMARKS.md):
 *
 *   entry  one PyMem allocation holding the key and value bytes themselves:
 *            varint(key_len * 8 + encoding * 2 + has_deadline)   LEB128, 7 bits a byte;
 *                                                 encoding is OBJECT ENCODING's hint (below)
 *            varint(value_len)
 *            deadline                             int64 ms since the epoch, host order,
 *                                                 present only when has_deadline
 *            key bytes, value bytes
 *          so a short pair is one pymalloc block (16-byte classes; 13 + 15 bytes -> 32)
 *          where two bytes objects cost 33 bytes of header each, rounded up (96 bytes).
 *          Python bytes are made only when a key or value is handed to Python; the plain
 *          path copies replies straight from the entry.
 *   slot   24 bytes in the `slots` array: the entry pointer (NULL in a free slot), the low
 *          32 bits of the key's hash, the prev/next slot numbers of the LRU list (head =
 *          least recently used; a free slot uses next for the free list) and the 32-bit
 *          dirty epoch. The array grows by doubling with realloc; the part beyond the
 *          high-water mark is never touched, so it costs address space, not RSS.
 *   clock  4 bytes per slot in the parallel `clocks` array (grown with `slots`): the
 *          table's clock (whole seconds, monotonic) when the entry was last read or written,
 *          for OBJECT IDLETIME; peeks (TTL, OBJECT, ...) leave it.
 *   index  an open-addressing array of int32 slot numbers (-1 = empty), linear probing,
 *          power-of-two size, load <= 1/2: 4 to 8 bytes per entry. Deletion shifts the
 *          following run back, so there are no tombstones.
 *
 * The hash is CPython's bytes hash (seeded per process, so hash flooding costs an attacker
 * what it costs against a dict); the index needs only its low 32 bits (at most 2^31 slots,
 * so the index never exceeds 2^32 positions), and comparing them first keeps a probe from
 * reading the entries of other keys.
 *
 * Dirty tracking. A change appends the key (a bytes object) to the `dirty` list unless the
 * slot's `dirty_epoch` says it is already there; `clear_dirty` empties the list and starts
 * a new epoch (O(1)). When the 32-bit epoch wraps, every slot's mark is reset first, so a
 * stale mark can never look current. A key deleted and written again in one epoch may be
 * listed twice, which is harmless: the log records the key's current state each time.
 *
 * Active expiry. `due` is a binary min-heap of (deadline, slot number), 16 bytes per
 * deadline set, pushed whenever an entry gets a new deadline; `expire_due` pops the pairs
 * that are due and removes the entry in the slot when its own deadline has passed (a pair
 * left by a changed deadline or a freed slot is skipped; a reused slot whose new key is due
 * is due anyway). The heap is rebuilt from the slots when it holds more than twice as many
 * pairs as there are deadlines (plus 1024).
 *
 * Snapshots. `snapshot()` records (slot number, hash) per live entry in LRU order, 8 bytes
 * per key, for SCAN cursors and log rewrites; reading it back yields the key now in that
 * slot when the slot still holds an entry with that hash (a key present throughout stays
 * in its slot, so it is always found).
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>
#include <limits.h>
#include <time.h>

#define NIL (-1)
#define MIN_INDEX 16

typedef struct {
    unsigned char *entry; /* NULL in a free slot */
    uint32_t hash;        /* low 32 bits of the key's hash */
    int32_t prev, next;   /* LRU neighbours; a free slot uses next for the free list */
    uint32_t dirty_epoch; /* listed in `dirty` when equal to the table's epoch */
} Slot;

_Static_assert(sizeof(Slot) == 24, "a slot is 24 bytes");

typedef struct {
    int64_t deadline;
    int32_t slot;
} Due;

typedef struct {
    PyObject_HEAD
    Slot *slots;
    int32_t slots_cap;
    int32_t free_head;   /* first free slot, NIL when none below slots_used */
    int32_t slots_used;  /* slots ever handed out (high-water mark) */
    int32_t *index;
    size_t index_mask;   /* index size - 1 */
    Py_ssize_t count;
    Py_ssize_t ttl_count;
    int32_t lru_head, lru_tail;
    long long max_bytes, used_bytes, overhead;
    long long hits, misses, evicted, expired;
    uint32_t epoch;      /* never 0 (see next_epoch) */
    int initialised;
    PyObject *dirty;     /* list of keys */
    char *out;           /* reply buffer reused by run() */
    size_t out_cap;
    Due *due;            /* the active-expiry heap (see above) */
    size_t due_len, due_cap;
    long long plain_calls[9]; /* commands run() served, indexed by PLAIN_GET ... */
    uint32_t *clocks;    /* per slot: when its entry was last used (clock_now then) */
    uint32_t clock_now;  /* seconds on a monotonic clock, read once per call from Python */
} Table;

/* The commands run() serves, in the order of the `plain_calls` getter's tuple. */
enum { PLAIN_GET, PLAIN_SET, PLAIN_PING, PLAIN_MGET, PLAIN_MSET, PLAIN_INCR, PLAIN_DECR, PLAIN_INCRBY,
       PLAIN_DECRBY };

static PyObject *NAME_GET, *NAME_SET, *NAME_PING, *NAME_MGET, *NAME_MSET, *NAME_INCR, *NAME_DECR, *NAME_INCRBY,
    *NAME_DECRBY;

/* ---------------------------------------------------------------- time and hashing */

static int64_t
now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* The low 32 bits of what bytes.__hash__ returns for the same bytes. */
static uint32_t
hash_buffer(const char *data, Py_ssize_t len)
{
#if PY_VERSION_HEX >= 0x030E0000
    return (uint32_t)Py_HashBuffer(data, len);
#else
    Py_hash_t h = _Py_HashBytes(data, len);
    return (uint32_t)(h == -1 ? -2 : h);
#endif
}

static inline uint32_t
hash_object(PyObject *key)
{
    return (uint32_t)PyObject_Hash(key); /* an exact bytes object: cannot fail */
}

static int
check_bytes(PyObject *obj, const char *what)
{
    if (!PyBytes_CheckExact(obj)) {
        PyErr_Format(PyExc_TypeError, "%s must be bytes, not %.100s", what, Py_TYPE(obj)->tp_name);
        return -1;
    }
    return 0;
}

/* ---------------------------------------------------------------- large arrays
 *
 * The slot array and the index come straight from mmap once they pass BIG_ARRAY bytes:
 * growing the slot array is then an mremap (no copy, and pages beyond the high-water mark
 * stay untouched) and a replaced index goes back to the system at once. Through malloc they
 * landed in the brk heap once glibc's mmap threshold had risen, and the copies a resize left
 * behind stayed resident: about 16 MiB of 100 per million keys, measured. Smaller arrays use
 * PyMem (a table in a test is a few hundred bytes). */

#include <sys/mman.h>

#define BIG_ARRAY ((size_t)1 << 20)

static void *
array_alloc(size_t size)
{
    if (size < BIG_ARRAY)
        return PyMem_Malloc(size);
    void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return p == MAP_FAILED ? NULL : p;
}

static void
array_free(void *p, size_t size)
{
    if (p == NULL)
        return;
    if (size < BIG_ARRAY)
        PyMem_Free(p);
    else
        munmap(p, size);
}

/* Resize an array of old_size bytes to size bytes (size > old_size); NULL on failure, the
 * old array then still valid. */
static void *
array_grow(void *p, size_t old_size, size_t size)
{
    if (size < BIG_ARRAY)
        return PyMem_Realloc(p, size);
    if (p != NULL && old_size >= BIG_ARRAY) {
        void *q = mremap(p, old_size, size, MREMAP_MAYMOVE);
        return q == MAP_FAILED ? NULL : q;
    }
    void *q = array_alloc(size);
    if (q != NULL && p != NULL) {
        memcpy(q, p, old_size);
        array_free(p, old_size);
    }
    return q;
}

/* ---------------------------------------------------------------- entries (see the layout above) */

typedef struct {
    char *key, *value;
    Py_ssize_t key_len, value_len;
    int64_t deadline; /* 0 = none */
    int encoding;     /* ENC_SHAPE, ENC_RAW or ENC_STRING */
} View;

/* How OBJECT ENCODING names a value, as Redis's object would be encoded: by its shape
 * (int / embstr / raw, what SET, INCR and the like store: every write starts here), raw
 * (APPEND, SETRANGE and SETBIT modify a string in place), or a string that is never int
 * (INCRBYFLOAT stores its result as a string even when it reads as an integer). RAM only:
 * a restart reads every value back by its shape, as Redis does after loading. */
enum { ENC_SHAPE = 0, ENC_RAW = 1, ENC_STRING = 2 };

static inline const unsigned char *
varint_get(const unsigned char *p, size_t *out)
{
    size_t v = 0;
    int shift = 0;
    unsigned char b;
    do {
        b = *p++;
        v |= (size_t)(b & 0x7f) << shift;
        shift += 7;
    } while (b & 0x80);
    *out = v;
    return p;
}

static inline unsigned char *
varint_put(unsigned char *p, size_t v)
{
    while (v >= 0x80) {
        *p++ = (unsigned char)(v | 0x80);
        v >>= 7;
    }
    *p++ = (unsigned char)v;
    return p;
}

static inline size_t
varint_len(size_t v)
{
    size_t n = 1;
    while (v >= 0x80) {
        v >>= 7;
        n++;
    }
    return n;
}

static inline void
entry_view(const unsigned char *e, View *v)
{
    size_t first, value_len;
    const unsigned char *p = varint_get(e, &first);
    p = varint_get(p, &value_len);
    v->deadline = 0;
    v->encoding = (int)((first >> 1) & 3);
    if (first & 1) {
        memcpy(&v->deadline, p, sizeof(int64_t));
        p += sizeof(int64_t);
    }
    v->key = (char *)p;
    v->key_len = (Py_ssize_t)(first >> 3);
    v->value = v->key + v->key_len;
    v->value_len = (Py_ssize_t)value_len;
}

/* A new entry holding copies of key and value (which may point into another entry). */
static unsigned char *
entry_new(const char *key, Py_ssize_t key_len, const char *value, Py_ssize_t value_len, int64_t deadline,
          int encoding)
{
    size_t first = (size_t)key_len * 8 + (size_t)encoding * 2 + (deadline != 0);
    size_t size = varint_len(first) + varint_len((size_t)value_len) + (deadline ? sizeof(int64_t) : 0)
                  + (size_t)key_len + (size_t)value_len;
    unsigned char *e = PyMem_Malloc(size), *p;
    if (e == NULL) {
        PyErr_NoMemory();
        return NULL;
    }
    p = varint_put(e, first);
    p = varint_put(p, (size_t)value_len);
    if (deadline) {
        memcpy(p, &deadline, sizeof(int64_t));
        p += sizeof(int64_t);
    }
    memcpy(p, key, (size_t)key_len);
    memcpy(p + key_len, value, (size_t)value_len);
    return e;
}

static inline PyObject *
key_object(const Slot *slot)
{
    View v;
    entry_view(slot->entry, &v);
    return PyBytes_FromStringAndSize(v.key, v.key_len);
}

static inline PyObject *
value_object(const Slot *slot)
{
    View v;
    entry_view(slot->entry, &v);
    return PyBytes_FromStringAndSize(v.value, v.value_len);
}

static inline int64_t
slot_deadline(const Slot *slot)
{
    View v;
    entry_view(slot->entry, &v);
    return v.deadline;
}

/* ---------------------------------------------------------------- the index */

/* Position in `index` holding the slot of (data, len, hash), or the empty position where it
 * would go; *found is the slot number or NIL. */
static size_t
probe(Table *t, const char *data, Py_ssize_t len, uint32_t hash, int32_t *found)
{
    size_t mask = t->index_mask, pos = (size_t)hash & mask;
    for (;;) {
        int32_t s = t->index[pos];
        if (s == NIL) {
            *found = NIL;
            return pos;
        }
        Slot *slot = &t->slots[s];
        if (slot->hash == hash) {
            View v;
            entry_view(slot->entry, &v);
            if (v.key_len == len && memcmp(v.key, data, (size_t)len) == 0) {
                *found = s;
                return pos;
            }
        }
        pos = (pos + 1) & mask;
    }
}

static int32_t
find_key(Table *t, PyObject *key, size_t *pos_out)
{
    int32_t found;
    size_t pos = probe(t, PyBytes_AS_STRING(key), PyBytes_GET_SIZE(key), hash_object(key), &found);
    if (pos_out)
        *pos_out = pos;
    return found;
}

/* Remove index[pos] and shift the rest of its run back so lookups never meet a hole. */
static void
index_remove(Table *t, size_t pos)
{
    size_t mask = t->index_mask, hole = pos, j = pos;
    for (;;) {
        j = (j + 1) & mask;
        int32_t s = t->index[j];
        if (s == NIL)
            break;
        size_t home = (size_t)t->slots[s].hash & mask;
        /* The entry at j may move to the hole when its home is not in (hole, j] cyclically. */
        int movable = (hole <= j) ? (home <= hole || home > j) : (home <= hole && home > j);
        if (movable) {
            t->index[hole] = s;
            hole = j;
        }
    }
    t->index[hole] = NIL;
}

static int
index_resize(Table *t, size_t size)
{
    int32_t *index = array_alloc(size * sizeof(int32_t));
    if (index == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    memset(index, 0xff, size * sizeof(int32_t)); /* every entry NIL */
    size_t mask = size - 1;
    for (int32_t s = t->lru_head; s != NIL; s = t->slots[s].next) {
        size_t pos = (size_t)t->slots[s].hash & mask;
        while (index[pos] != NIL)
            pos = (pos + 1) & mask;
        index[pos] = s;
    }
    array_free(t->index, (t->index_mask + 1) * sizeof(int32_t));
    t->index = index;
    t->index_mask = mask;
    return 0;
}

/* ---------------------------------------------------------------- the LRU list */

static inline void
lru_unlink(Table *t, int32_t s)
{
    Slot *slot = &t->slots[s];
    if (slot->prev != NIL)
        t->slots[slot->prev].next = slot->next;
    else
        t->lru_head = slot->next;
    if (slot->next != NIL)
        t->slots[slot->next].prev = slot->prev;
    else
        t->lru_tail = slot->prev;
}

static inline void
lru_append(Table *t, int32_t s)
{
    Slot *slot = &t->slots[s];
    slot->prev = t->lru_tail;
    slot->next = NIL;
    if (t->lru_tail != NIL)
        t->slots[t->lru_tail].next = s;
    else
        t->lru_head = s;
    t->lru_tail = s;
}

/* The table's clock (OBJECT IDLETIME's): whole seconds of a monotonic clock, read once per
 * call from Python or per run(), so a GET costs no clock read of its own. */
static inline void
clock_tick(Table *t)
{
    struct timespec ts;
#ifdef CLOCK_MONOTONIC_COARSE
    clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
#else
    clock_gettime(CLOCK_MONOTONIC, &ts);
#endif
    t->clock_now = (uint32_t)ts.tv_sec;
}

static inline void
lru_touch(Table *t, int32_t s)
{
    t->clocks[s] = t->clock_now;
    if (t->lru_tail != s) {
        lru_unlink(t, s);
        lru_append(t, s);
    }
}

/* ---------------------------------------------------------------- the deadline heap */

static void
due_sift_down(Due *h, size_t n, size_t i)
{
    Due item = h[i];
    for (;;) {
        size_t child = 2 * i + 1;
        if (child >= n)
            break;
        if (child + 1 < n && h[child + 1].deadline < h[child].deadline)
            child++;
        if (h[child].deadline >= item.deadline)
            break;
        h[i] = h[child];
        i = child;
    }
    h[i] = item;
}

/* Refill the heap with one pair per entry that has a deadline (there are fewer of them than
 * pairs, so it fits). */
static void
due_rebuild(Table *t)
{
    t->due_len = 0;
    for (int32_t s = t->lru_head; s != NIL; s = t->slots[s].next) {
        int64_t deadline = slot_deadline(&t->slots[s]);
        if (deadline)
            t->due[t->due_len++] = (Due){deadline, s};
    }
    for (size_t i = t->due_len / 2; i-- > 0;)
        due_sift_down(t->due, t->due_len, i);
}

/* Queue slot s, whose entry now has `deadline`, for active expiry. */
static int
due_push(Table *t, int32_t s, int64_t deadline)
{
    if (t->due_len > 2 * (size_t)t->ttl_count + 1024) {
        due_rebuild(t); /* includes slot s */
        return 0;
    }
    if (t->due_len == t->due_cap) {
        size_t cap = t->due_cap ? t->due_cap * 2 : 16;
        Due *due = array_grow(t->due, t->due_cap * sizeof(Due), cap * sizeof(Due));
        if (due == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        t->due = due;
        t->due_cap = cap;
    }
    size_t i = t->due_len++;
    while (i > 0 && t->due[(i - 1) / 2].deadline > deadline) {
        t->due[i] = t->due[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    t->due[i] = (Due){deadline, s};
    return 0;
}

static void
due_clear(Table *t)
{
    array_free(t->due, t->due_cap * sizeof(Due));
    t->due = NULL;
    t->due_len = t->due_cap = 0;
}

/* ---------------------------------------------------------------- slots */

/* Append the key to the dirty list unless this slot is already listed in this epoch.
 * key_obj, when given, is the key as a bytes object (saves making one). */
static inline int
mark_dirty(Table *t, Slot *slot, PyObject *key_obj)
{
    if (slot->dirty_epoch == t->epoch)
        return 0;
    PyObject *key = key_obj != NULL ? Py_NewRef(key_obj) : key_object(slot);
    if (key == NULL)
        return -1;
    int rc = PyList_Append(t->dirty, key);
    Py_DECREF(key);
    if (rc == 0)
        slot->dirty_epoch = t->epoch;
    return rc;
}

/* Start a new dirty epoch. On wrap-around every slot's mark is reset, so no slot marked
 * 2^32 epochs ago can look listed. */
static void
next_epoch(Table *t)
{
    if (++t->epoch == 0) {
        for (int32_t s = 0; s < t->slots_used; s++)
            t->slots[s].dirty_epoch = 0;
        t->epoch = 1;
    }
}

/* Give a stored entry a deadline (0: none), keeping ttl_count; the entry is rebuilt when
 * its deadline field appears or goes. Returns 0 or -1. */
static int
slot_set_deadline(Table *t, int32_t s, int64_t deadline)
{
    Slot *slot = &t->slots[s];
    View v;
    entry_view(slot->entry, &v);
    if ((v.deadline != 0) == (deadline != 0)) {
        if (deadline)
            memcpy(v.key - sizeof(int64_t), &deadline, sizeof(int64_t));
    } else {
        unsigned char *e = entry_new(v.key, v.key_len, v.value, v.value_len, deadline, v.encoding);
        if (e == NULL)
            return -1;
        PyMem_Free(slot->entry);
        slot->entry = e;
    }
    t->ttl_count += (deadline != 0) - (v.deadline != 0);
    return deadline && deadline != v.deadline ? due_push(t, s, deadline) : 0;
}

/* Room for one more entry: grow the slot array and the index as needed. Returns 1 when
 * the index was rebuilt (positions from an earlier probe are stale), 0, or -1 on error. */
static int
reserve_one(Table *t)
{
    int rebuilt = 0;
    if ((size_t)(t->count + 1) * 2 > t->index_mask + 1) {
        if (index_resize(t, (t->index_mask + 1) * 2) < 0)
            return -1;
        rebuilt = 1;
    }
    if (t->free_head == NIL && t->slots_used == t->slots_cap) {
        if (t->slots_cap >= INT32_MAX / 2) {
            PyErr_SetString(PyExc_MemoryError, "L1 table is full");
            return -1;
        }
        int32_t cap = t->slots_cap ? t->slots_cap * 2 : 64;
        Slot *slots = array_grow(t->slots, (size_t)t->slots_cap * sizeof(Slot), (size_t)cap * sizeof(Slot));
        if (slots == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        t->slots = slots;
        uint32_t *clocks = array_grow(t->clocks, (size_t)t->slots_cap * sizeof(uint32_t),
                                      (size_t)cap * sizeof(uint32_t));
        if (clocks == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        t->clocks = clocks;
        t->slots_cap = cap;
    }
    return rebuilt;
}

/* A new slot for entry e at index position pos (from a probe that found nothing, still
 * valid after reserve_one). Takes ownership of e. */
static int32_t
insert_new(Table *t, size_t pos, unsigned char *e, uint32_t hash)
{
    int32_t s;
    if (t->free_head != NIL) {
        s = t->free_head;
        t->free_head = t->slots[s].next;
    } else {
        s = t->slots_used++;
    }
    Slot *slot = &t->slots[s];
    View v;
    entry_view(e, &v);
    slot->entry = e;
    slot->hash = hash;
    slot->dirty_epoch = t->epoch - 1;
    t->index[pos] = s;
    lru_append(t, s);
    t->clocks[s] = t->clock_now;
    t->count++;
    if (v.deadline)
        t->ttl_count++;
    t->used_bytes += (long long)v.key_len + v.value_len + t->overhead;
    return s;
}

/* Drop slot s found at index position pos; marks it dirty first. Returns -1 only when the
 * dirty list cannot grow (the entry is removed anyway). */
static int
remove_slot(Table *t, int32_t s, size_t pos)
{
    Slot *slot = &t->slots[s];
    int rc = mark_dirty(t, slot, NULL);
    View v;
    entry_view(slot->entry, &v);
    index_remove(t, pos);
    lru_unlink(t, s);
    t->used_bytes -= (long long)v.key_len + v.value_len + t->overhead;
    t->count--;
    if (v.deadline)
        t->ttl_count--;
    PyMem_Free(slot->entry);
    slot->entry = NULL;
    slot->next = t->free_head;
    t->free_head = s;
    return rc;
}

static size_t
position_of(Table *t, int32_t s)
{
    View v;
    int32_t found;
    entry_view(t->slots[s].entry, &v);
    return probe(t, v.key, v.key_len, t->slots[s].hash, &found);
}

/* Evict least recently used entries until the budget holds; returns how many, -1 on error. */
static long long
evict_to_fit(Table *t)
{
    long long n = 0;
    while (t->used_bytes > t->max_bytes && t->lru_head != NIL) {
        int32_t s = t->lru_head;
        if (remove_slot(t, s, position_of(t, s)) < 0)
            return -1;
        t->evicted++;
        n++;
    }
    return n;
}

/* The slot of key if present and not past its deadline; an expired entry is removed here
 * (counted in `expired`). NIL when absent; -2 on error. */
static int32_t
live_slot(Table *t, const char *data, Py_ssize_t len, uint32_t hash, int64_t *now)
{
    int32_t s;
    size_t pos = probe(t, data, len, hash, &s);
    if (s == NIL)
        return NIL;
    int64_t deadline = slot_deadline(&t->slots[s]);
    if (deadline) {
        if (*now == 0)
            *now = now_ms();
        if (deadline <= *now) {
            t->expired++;
            return remove_slot(t, s, pos) < 0 ? -2 : NIL;
        }
    }
    return s;
}

/* Store value under key; the key becomes most recently used. key_obj, when given, is the
 * key as a bytes object (put to the dirty list instead of a new one). A replaced value of
 * the same length (and a deadline present or absent as before) is overwritten in place.
 * Returns 0 or -1. */
static int
store(Table *t, const char *key_data, Py_ssize_t key_len, uint32_t hash, PyObject *key_obj,
      const char *value, Py_ssize_t value_len, int64_t deadline)
{
    int32_t s;
    size_t pos = probe(t, key_data, key_len, hash, &s);
    if (s != NIL) {
        Slot *slot = &t->slots[s];
        if (mark_dirty(t, slot, key_obj) < 0)
            return -1;
        View v;
        entry_view(slot->entry, &v);
        if (v.value_len == value_len && (v.deadline != 0) == (deadline != 0) && v.encoding == ENC_SHAPE) {
            memmove(v.value, value, (size_t)value_len);
            if (deadline)
                memcpy(v.key - sizeof(int64_t), &deadline, sizeof(int64_t));
        } else {
            unsigned char *e = entry_new(v.key, v.key_len, value, value_len, deadline, ENC_SHAPE);
            if (e == NULL)
                return -1;
            PyMem_Free(slot->entry);
            slot->entry = e;
        }
        t->used_bytes += (long long)value_len - v.value_len;
        t->ttl_count += (deadline != 0) - (v.deadline != 0);
        lru_touch(t, s);
        if (deadline && deadline != v.deadline && due_push(t, s, deadline) < 0)
            return -1;
    } else {
        int rebuilt = reserve_one(t);
        if (rebuilt < 0)
            return -1;
        if (rebuilt)
            pos = probe(t, key_data, key_len, hash, &s);
        unsigned char *e = entry_new(key_data, key_len, value, value_len, deadline, ENC_SHAPE);
        if (e == NULL)
            return -1;
        s = insert_new(t, pos, e, hash);
        if (mark_dirty(t, &t->slots[s], key_obj) < 0 || (deadline && due_push(t, s, deadline) < 0))
            return -1;
    }
    if (t->used_bytes > t->max_bytes && evict_to_fit(t) < 0)
        return -1;
    return 0;
}

static int
parse_deadline(PyObject *obj, int64_t *deadline)
{
    if (obj == NULL || obj == Py_None) {
        *deadline = 0;
        return 0;
    }
    long long value = PyLong_AsLongLong(obj);
    if (value == -1 && PyErr_Occurred())
        return -1;
    if (value <= 0) {
        PyErr_SetString(PyExc_ValueError, "deadline must be a positive number of ms since the epoch");
        return -1;
    }
    *deadline = value;
    return 0;
}

/* ---------------------------------------------------------------- Python methods */

static PyObject *
Table_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    Table *t = (Table *)type->tp_alloc(type, 0);
    if (t == NULL)
        return NULL;
    t->lru_head = t->lru_tail = t->free_head = NIL;
    t->epoch = 1;
    t->dirty = PyList_New(0);
    if (t->dirty == NULL || index_resize(t, MIN_INDEX) < 0) {
        Py_DECREF(t);
        return NULL;
    }
    return (PyObject *)t;
}

static int
Table_init(Table *t, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"max_bytes", "overhead", NULL};
    long long max_bytes, overhead;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "LL", kwlist, &max_bytes, &overhead))
        return -1;
    if (max_bytes < 0 || overhead < 0) {
        PyErr_SetString(PyExc_ValueError, "max_bytes and overhead must be >= 0");
        return -1;
    }
    if (t->initialised) {
        PyErr_SetString(PyExc_RuntimeError, "Table is already initialised");
        return -1;
    }
    t->initialised = 1;
    t->max_bytes = max_bytes;
    t->overhead = overhead;
    return 0;
}

static void
drop_all(Table *t)
{
    for (int32_t s = 0; s < t->slots_used; s++) {
        PyMem_Free(t->slots[s].entry);
        t->slots[s].entry = NULL;
    }
    t->slots_used = 0;
    t->free_head = t->lru_head = t->lru_tail = NIL;
    t->count = t->ttl_count = 0;
    t->used_bytes = 0;
}

static void
Table_dealloc(Table *t)
{
    if (t->slots != NULL)
        drop_all(t);
    array_free(t->slots, (size_t)t->slots_cap * sizeof(Slot));
    array_free(t->clocks, (size_t)t->slots_cap * sizeof(uint32_t));
    if (t->index != NULL)
        array_free(t->index, (t->index_mask + 1) * sizeof(int32_t));
    PyMem_Free(t->out);
    due_clear(t);
    Py_XDECREF(t->dirty);
    Py_TYPE(t)->tp_free((PyObject *)t);
}

static Py_ssize_t
Table_len(Table *t)
{
    return t->count;
}

/* The slot of a live entry for a key object (lazy expiry applied), NIL without one, -2 on
 * an error (set). */
static int32_t
live_key_slot(Table *t, PyObject *key)
{
    if (check_bytes(key, "key") < 0)
        return -2;
    int64_t now = 0;
    return live_slot(t, PyBytes_AS_STRING(key), PyBytes_GET_SIZE(key), hash_object(key), &now);
}

/* get(key) and get_with_deadline(key): a read with lazy expiry, LRU move and hit/miss. */
static int32_t
read_key_as(Table *t, PyObject *key, int touch)
{
    clock_tick(t);
    int32_t s = live_key_slot(t, key);
    if (s == NIL)
        t->misses++;
    else if (s >= 0) {
        t->hits++;
        if (touch)
            lru_touch(t, s);
    }
    return s;
}

static int32_t
read_key(Table *t, PyObject *key)
{
    return read_key_as(t, key, 1);
}

static PyObject *
Table_get(Table *t, PyObject *key)
{
    int32_t s = read_key(t, key);
    if (s == -2)
        return NULL;
    if (s == NIL)
        Py_RETURN_NONE;
    return value_object(&t->slots[s]);
}

static PyObject *
value_and_deadline(Table *t, PyObject *key, int touch)
{
    int32_t s = read_key_as(t, key, touch);
    if (s == -2)
        return NULL;
    if (s == NIL)
        Py_RETURN_NONE;
    View v;
    entry_view(t->slots[s].entry, &v);
    if (v.deadline)
        return Py_BuildValue("(y#L)", v.value, v.value_len, (long long)v.deadline);
    return Py_BuildValue("(y#O)", v.value, v.value_len, Py_None);
}

static PyObject *
Table_get_with_deadline(Table *t, PyObject *key)
{
    return value_and_deadline(t, key, 1);
}

/* peek_with_deadline(key): get_with_deadline (a read, counted as a hit or miss) that
 * leaves the key where it is in the LRU order, as Redis's TTL, TYPE, EXISTS and OBJECT
 * leave a key's LRU clock. */
static PyObject *
Table_peek_with_deadline(Table *t, PyObject *key)
{
    return value_and_deadline(t, key, 0);
}

static PyObject *
Table_deadline(Table *t, PyObject *key)
{
    if (check_bytes(key, "key") < 0)
        return NULL;
    int32_t s = find_key(t, key, NULL);
    int64_t deadline = s == NIL ? 0 : slot_deadline(&t->slots[s]);
    if (!deadline)
        Py_RETURN_NONE;
    return PyLong_FromLongLong(deadline);
}

/* encoding(key) -> the entry's ENC_* hint, or None without a live entry; no side effects
 * beyond lazy expiry. */
static PyObject *
Table_encoding(Table *t, PyObject *key)
{
    int32_t s = live_key_slot(t, key);
    if (s < 0)
        return s == NIL ? Py_NewRef(Py_None) : NULL;
    View v;
    entry_view(t->slots[s].entry, &v);
    return PyLong_FromLong(v.encoding);
}

/* idle(key) -> seconds since the key was last read or written (OBJECT IDLETIME), or None
 * without a live entry; the key keeps its place and its clock. */
static PyObject *
Table_idle(Table *t, PyObject *key)
{
    int32_t s = live_key_slot(t, key);
    if (s < 0)
        return s == NIL ? Py_NewRef(Py_None) : NULL;
    clock_tick(t);
    return PyLong_FromUnsignedLong(t->clock_now - t->clocks[s]);
}

/* set_encoding(key, hint) -> bool: give a live entry an ENC_* hint. Only the low bits of
 * the entry's first varint change, so it keeps its length and is rewritten in place; the
 * hint is not a change of the value (nothing is marked dirty). */
static PyObject *
Table_set_encoding(Table *t, PyObject *args)
{
    PyObject *key;
    int encoding;
    if (!PyArg_ParseTuple(args, "Oi", &key, &encoding))
        return NULL;
    if (encoding < ENC_SHAPE || encoding > ENC_STRING) {
        PyErr_SetString(PyExc_ValueError, "encoding must be 0, 1 or 2");
        return NULL;
    }
    int32_t s = live_key_slot(t, key);
    if (s == -2)
        return NULL;
    if (s == NIL)
        Py_RETURN_FALSE;
    unsigned char *e = t->slots[s].entry;
    size_t first;
    varint_get(e, &first);
    varint_put(e, (first & ~(size_t)6) | ((size_t)encoding << 1));
    Py_RETURN_TRUE;
}

static PyObject *
Table_contains(Table *t, PyObject *key)
{
    int32_t s = live_key_slot(t, key);
    if (s == -2)
        return NULL;
    return PyBool_FromLong(s != NIL);
}

static PyObject *
Table_put(Table *t, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"key", "value", "deadline", NULL};
    PyObject *key, *value, *deadline_obj = NULL;
    int64_t deadline;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OO|O", kwlist, &key, &value, &deadline_obj))
        return NULL;
    if (check_bytes(key, "key") < 0 || check_bytes(value, "value") < 0 || parse_deadline(deadline_obj, &deadline) < 0)
        return NULL;
    clock_tick(t);
    if (store(t, PyBytes_AS_STRING(key), PyBytes_GET_SIZE(key), hash_object(key), key,
              PyBytes_AS_STRING(value), PyBytes_GET_SIZE(value), deadline) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *
Table_set_deadline(Table *t, PyObject *args)
{
    PyObject *key, *deadline_obj;
    int64_t deadline;
    if (!PyArg_ParseTuple(args, "OO", &key, &deadline_obj))
        return NULL;
    if (check_bytes(key, "key") < 0 || parse_deadline(deadline_obj, &deadline) < 0)
        return NULL;
    int32_t s = find_key(t, key, NULL);
    if (s == NIL)
        Py_RETURN_FALSE;
    Slot *slot = &t->slots[s];
    if (mark_dirty(t, slot, key) < 0 || slot_set_deadline(t, s, deadline) < 0)
        return NULL;
    Py_RETURN_TRUE;
}

static PyObject *
delete_key(Table *t, PyObject *key, int count_expired)
{
    if (check_bytes(key, "key") < 0)
        return NULL;
    size_t pos;
    int32_t s = find_key(t, key, &pos);
    if (s == NIL)
        Py_RETURN_FALSE;
    if (count_expired)
        t->expired++;
    if (mark_dirty(t, &t->slots[s], key) < 0)
        return NULL;
    if (remove_slot(t, s, pos) < 0)
        return NULL;
    Py_RETURN_TRUE;
}

static PyObject *
Table_delete(Table *t, PyObject *key)
{
    return delete_key(t, key, 0);
}

static PyObject *
Table_expire(Table *t, PyObject *key)
{
    return delete_key(t, key, 1);
}

static PyObject *
Table_evict(Table *t, PyObject *unused)
{
    long long n = evict_to_fit(t);
    return n < 0 ? NULL : PyLong_FromLongLong(n);
}

/* expire_due(limit=1000, now=None): active expiry, see the layout notes. */
static PyObject *
Table_expire_due(Table *t, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"limit", "now", NULL};
    Py_ssize_t limit = 1000;
    PyObject *now_obj = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "|nO", kwlist, &limit, &now_obj))
        return NULL;
    int64_t now;
    if (now_obj == Py_None)
        now = now_ms();
    else if ((now = PyLong_AsLongLong(now_obj)) == -1 && PyErr_Occurred())
        return NULL;
    long long n = 0;
    while (t->due_len && t->due[0].deadline <= now && n < limit) {
        int32_t s = t->due[0].slot;
        t->due[0] = t->due[--t->due_len];
        due_sift_down(t->due, t->due_len, 0);
        if (s >= t->slots_used || t->slots[s].entry == NULL)
            continue;
        int64_t deadline = slot_deadline(&t->slots[s]);
        if (deadline && deadline <= now) {
            t->expired++;
            n++;
            if (remove_slot(t, s, position_of(t, s)) < 0)
                return NULL;
        }
    }
    return PyLong_FromLongLong(n);
}

static PyObject *
Table_keys(Table *t, PyObject *unused)
{
    PyObject *keys = PyList_New(t->count);
    if (keys == NULL)
        return NULL;
    Py_ssize_t i = 0;
    for (int32_t s = t->lru_head; s != NIL; s = t->slots[s].next) {
        PyObject *key = key_object(&t->slots[s]);
        if (key == NULL) {
            Py_DECREF(keys);
            return NULL;
        }
        PyList_SET_ITEM(keys, i++, key);
    }
    return keys;
}

static PyObject *
Table_ttl_items(Table *t, PyObject *unused)
{
    PyObject *items = PyList_New(0);
    if (items == NULL)
        return NULL;
    for (int32_t s = t->lru_head; s != NIL; s = t->slots[s].next) {
        View v;
        entry_view(t->slots[s].entry, &v);
        if (!v.deadline)
            continue;
        PyObject *item = Py_BuildValue("(Ly#)", (long long)v.deadline, v.key, v.key_len);
        if (item == NULL || PyList_Append(items, item) < 0) {
            Py_XDECREF(item);
            Py_DECREF(items);
            return NULL;
        }
        Py_DECREF(item);
    }
    return items;
}

static PyObject *
Table_clear(Table *t, PyObject *unused)
{
    drop_all(t);
    due_clear(t);
    array_free(t->slots, (size_t)t->slots_cap * sizeof(Slot));
    array_free(t->clocks, (size_t)t->slots_cap * sizeof(uint32_t));
    t->slots = NULL;
    t->clocks = NULL;
    t->slots_cap = 0;
    if (PyList_SetSlice(t->dirty, 0, PyList_GET_SIZE(t->dirty), NULL) < 0)
        return NULL;
    next_epoch(t);
    if (index_resize(t, MIN_INDEX) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *
Table_clear_dirty(Table *t, PyObject *unused)
{
    if (PyList_SetSlice(t->dirty, 0, PyList_GET_SIZE(t->dirty), NULL) < 0)
        return NULL;
    next_epoch(t);
    Py_RETURN_NONE;
}

/* ---------------------------------------------------------------- the reply buffer */

static int
out_reserve(Table *t, size_t *len, size_t extra)
{
    if (*len + extra <= t->out_cap)
        return 0;
    size_t cap = t->out_cap ? t->out_cap : 4096;
    while (cap < *len + extra)
        cap *= 2;
    char *out = PyMem_Realloc(t->out, cap);
    if (out == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    t->out = out;
    t->out_cap = cap;
    return 0;
}

/* A reply or batch bigger than this is not kept for reuse (the next one reallocates). */
#define OUT_KEEP (1 << 20)

static void
out_trim(Table *t)
{
    if (t->out_cap > OUT_KEEP) {
        PyMem_Free(t->out);
        t->out = NULL;
        t->out_cap = 0;
    }
}

/* ---------------------------------------------------------------- encode */

static void
put_le(char *p, uint64_t value, int bytes)
{
    for (int i = 0; i < bytes; i++)
        p[i] = (char)(value >> (8 * i));
}

static PyObject *
Table_encode(Table *t, PyObject *keys)
{
    PyObject *seq = PySequence_Fast(keys, "keys must be iterable");
    if (seq == NULL)
        return NULL;
    size_t len = 0;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *key = items[i];
        if (check_bytes(key, "key") < 0)
            goto error;
        int32_t s = find_key(t, key, NULL);
        Py_ssize_t key_len = PyBytes_GET_SIZE(key);
        View v = {0};
        if (s != NIL)
            entry_view(t->slots[s].entry, &v);
        Py_ssize_t value_len = v.value_len;
        if (out_reserve(t, &len, 16 + (size_t)key_len + (size_t)value_len) < 0)
            goto error;
        char *p = t->out + len;
        put_le(p, (uint64_t)key_len, 4);
        put_le(p + 4, s == NIL ? 0xffffffffu : (uint64_t)value_len, 4);
        put_le(p + 8, (uint64_t)v.deadline, 8);
        memcpy(p + 16, PyBytes_AS_STRING(key), (size_t)key_len);
        if (s != NIL)
            memcpy(p + 16 + key_len, v.value, (size_t)value_len);
        len += 16 + (size_t)key_len + (size_t)value_len;
    }
    Py_DECREF(seq);
    PyObject *blob = PyBytes_FromStringAndSize(t->out, (Py_ssize_t)len);
    out_trim(t);
    return blob;
error:
    Py_DECREF(seq);
    out_trim(t);
    return NULL;
}

/* ---------------------------------------------------------------- run: the plain path
 *
 * The commands served here: GET, SET key value, MGET, MSET, INCR, DECR, INCRBY, DECRBY,
 * PING (multibulk, or a bare inline PING line). Each one has exactly the effects and
 * reply of the general path (arca/commands/); whatever would answer an error (a
 * non-integer, an overflow, a value over the budget) or is anything else ends the run,
 * and the general path takes over from that command. */

/* A canonical RESP length ("0" or digits without a leading zero, at most 18 of them) ending
 * in CRLF, starting at p; returns the position after the CRLF or NULL. */
static const char *
parse_length(const char *p, const char *end, long long *value)
{
    const char *start = p;
    long long v = 0;
    while (p < end && *p >= '0' && *p <= '9') {
        if (p - start == 18)
            return NULL; /* a 19th digit: refused before it could overflow */
        v = v * 10 + (*p - '0');
        p++;
    }
    if (p == start || (*start == '0' && p - start > 1) || end - p < 2 || p[0] != '\r' || p[1] != '\n')
        return NULL;
    *value = v;
    return p + 2;
}

/* One `$len\r\n<bytes>\r\n` item; returns the position after it or NULL. */
static const char *
parse_bulk(const char *p, const char *end, long long max_bulk, const char **data, Py_ssize_t *len)
{
    long long n;
    if (p >= end || *p != '$' || (p = parse_length(p + 1, end, &n)) == NULL || n > max_bulk)
        return NULL;
    if (end - p < n + 2 || p[n] != '\r' || p[n + 1] != '\n')
        return NULL;
    *data = p;
    *len = (Py_ssize_t)n;
    return p + n + 2;
}

/* Whether data[0:len] is the command name `upper` (upper case, ASCII letters), any case. */
static inline int
name_is(const char *data, Py_ssize_t len, const char *upper)
{
    Py_ssize_t i = 0;
    for (; upper[i]; i++)
        if (i >= len || (data[i] & 0xdf) != upper[i])
            return 0;
    return i == len;
}

/* A signed 64-bit integer written as Redis's string2ll accepts it (optional '-', digits, no
 * leading zero, no "-0", in range); 0 when it is not one. */
static int
parse_ll(const char *data, Py_ssize_t len, long long *out)
{
    if (len < 1 || len > 20)
        return 0;
    Py_ssize_t i = data[0] == '-' && len > 1;
    if (data[i] == '0' && len > 1)
        return 0;
    unsigned long long v = 0;
    for (Py_ssize_t j = i; j < len; j++) {
        if (data[j] < '0' || data[j] > '9' || v > (ULLONG_MAX - 9) / 10)
            return 0;
        v = v * 10 + (unsigned long long)(data[j] - '0');
    }
    if (i) {
        if (v > (unsigned long long)LLONG_MAX + 1)
            return 0;
        *out = v == (unsigned long long)LLONG_MAX + 1 ? LLONG_MIN : -(long long)v;
    } else {
        if (v > (unsigned long long)LLONG_MAX)
            return 0;
        *out = (long long)v;
    }
    return 1;
}

/* The decimal digits of v at out (no terminator); returns how many. sprintf cost about 15%
 * of the server's CPU on pipelined GETs. */
static size_t
format_ll(char *out, long long v)
{
    char digits[20];
    unsigned long long u = v < 0 ? 0ULL - (unsigned long long)v : (unsigned long long)v;
    size_t n = 0, len = 0;
    do {
        digits[n++] = (char)('0' + u % 10);
        u /= 10;
    } while (u);
    if (v < 0)
        out[len++] = '-';
    while (n)
        out[len++] = digits[--n];
    return len;
}

/* `<prefix><v>\r\n` at out (at most 23 bytes); returns its length. */
static size_t
format_line(char *out, char prefix, long long v)
{
    out[0] = prefix;
    size_t len = 1 + format_ll(out + 1, v);
    out[len++] = '\r';
    out[len++] = '\n';
    return len;
}

/* Append the reply to a read of slot s (NIL: a miss) to the reply buffer. */
static int
reply_value(Table *t, size_t *len, int32_t s, const char *null_reply, size_t null_len)
{
    if (s == NIL) {
        t->misses++;
        if (out_reserve(t, len, null_len) < 0)
            return -1;
        memcpy(t->out + *len, null_reply, null_len);
        *len += null_len;
        return 0;
    }
    t->hits++;
    lru_touch(t, s);
    View v;
    entry_view(t->slots[s].entry, &v);
    Py_ssize_t n = v.value_len;
    if (out_reserve(t, len, (size_t)n + 32) < 0)
        return -1;
    *len += format_line(t->out + *len, '$', n);
    memcpy(t->out + *len, v.value, (size_t)n);
    *len += (size_t)n;
    t->out[(*len)++] = '\r';
    t->out[(*len)++] = '\n';
    return 0;
}

static int
reply_bytes(Table *t, size_t *len, const char *text, size_t n)
{
    if (out_reserve(t, len, n) < 0)
        return -1;
    memcpy(t->out + *len, text, n);
    *len += n;
    return 0;
}

/* The plain commands run() serves; anything else ends its run. */
static PyObject *
Table_run(Table *t, PyObject *args)
{
    Py_buffer view;
    int resp;
    Py_ssize_t cap, max_items = 1024 * 1024;
    long long max_bulk;
    if (!PyArg_ParseTuple(args, "y*inL|n", &view, &resp, &cap, &max_bulk, &max_items))
        return NULL;
    if (cap < 0 || max_bulk < 0 || max_items < 1) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_ValueError, "out_cap and max_bulk must be >= 0, max_items >= 1");
        return NULL;
    }
    const char *begin = view.buf, *end = begin + view.len, *p = begin;
    const char *null_reply = resp == 3 ? "_\r\n" : "$-1\r\n";
    size_t null_len = resp == 3 ? 3 : 5;
    size_t len = 0;
    Py_ssize_t count = 0;
    PyObject *last = Py_None;
    int64_t now = 0;
    clock_tick(t);

    while (p < end && len <= (size_t)cap) {
        long long argc;
        const char *q, *name, *key, *value;
        Py_ssize_t name_len, key_len, value_len;
        if (*p != '*') {
            /* An inline command: only a bare `PING` line (what health checks and
             * redis-benchmark send); any other inline line is left to the general parser. */
            if (end - p >= 5 && name_is(p, 4, "PING") && (p[4] == '\n' || (p[4] == '\r' && end - p >= 6 && p[5] == '\n'))) {
                if (reply_bytes(t, &len, "+PONG\r\n", 7) < 0)
                    goto error;
                p += p[4] == '\n' ? 5 : 6;
                count++;
                last = NAME_PING;
                t->plain_calls[PLAIN_PING]++;
                continue;
            }
            break;
        }
        if ((q = parse_length(p + 1, end, &argc)) == NULL || argc < 1 || argc > max_items
                || (q = parse_bulk(q, end, max_bulk, &name, &name_len)) == NULL)
            break;
        if (argc == 1) {
            if (!name_is(name, name_len, "PING"))
                break;
            if (reply_bytes(t, &len, "+PONG\r\n", 7) < 0)
                goto error;
            last = NAME_PING;
            t->plain_calls[PLAIN_PING]++;
        } else if (argc == 2 && name_is(name, name_len, "GET")) {
            if ((q = parse_bulk(q, end, max_bulk, &key, &key_len)) == NULL)
                break;
            int32_t s = live_slot(t, key, key_len, hash_buffer(key, key_len), &now);
            if (s == -2 || reply_value(t, &len, s, null_reply, null_len) < 0)
                goto error;
            last = NAME_GET;
            t->plain_calls[PLAIN_GET]++;
        } else if (argc == 3 && name_is(name, name_len, "SET")) {
            if ((q = parse_bulk(q, end, max_bulk, &key, &key_len)) == NULL
                    || (q = parse_bulk(q, end, max_bulk, &value, &value_len)) == NULL)
                break;
            if ((long long)key_len + value_len + t->overhead > t->max_bytes)
                break; /* refused with -OOM by the general path */
            if (store(t, key, key_len, hash_buffer(key, key_len), NULL, value, value_len, 0) < 0
                    || reply_bytes(t, &len, "+OK\r\n", 5) < 0)
                goto error;
            last = NAME_SET;
            t->plain_calls[PLAIN_SET]++;
        } else if ((argc == 2 && (name_is(name, name_len, "INCR") || name_is(name, name_len, "DECR")))
                   || (argc == 3 && (name_is(name, name_len, "INCRBY") || name_is(name, name_len, "DECRBY")))) {
            long long delta = (name[0] & 0xdf) == 'I' ? 1 : -1, result;
            if ((q = parse_bulk(q, end, max_bulk, &key, &key_len)) == NULL)
                break;
            if (argc == 3) {
                long long amount;
                if ((q = parse_bulk(q, end, max_bulk, &value, &value_len)) == NULL
                        || !parse_ll(value, value_len, &amount) || (delta < 0 && amount == LLONG_MIN))
                    break; /* the error replies come from the general path */
                delta *= amount;
            }
            uint32_t hash = hash_buffer(key, key_len);
            int32_t s = live_slot(t, key, key_len, hash, &now);
            if (s == -2)
                goto error;
            long long current = 0;
            int64_t deadline = 0;
            if (s != NIL) {
                View old;
                entry_view(t->slots[s].entry, &old);
                if (!parse_ll(old.value, old.value_len, &current))
                    break; /* not an integer: -ERR from the general path (which counts the read) */
                deadline = old.deadline;
            }
            if (__builtin_add_overflow(current, delta, &result) || key_len + 20 + t->overhead > t->max_bytes)
                break;
            if (s == NIL)
                t->misses++;
            else
                t->hits++;
            char digits[24];
            size_t n = format_ll(digits, result);
            if (store(t, key, key_len, hash, NULL, digits, (Py_ssize_t)n, deadline) < 0
                    || out_reserve(t, &len, 32) < 0)
                goto error;
            len += format_line(t->out + len, ':', result);
            int which = (name[0] & 0xdf) == 'I' ? (argc == 2 ? PLAIN_INCR : PLAIN_INCRBY)
                                                 : (argc == 2 ? PLAIN_DECR : PLAIN_DECRBY);
            last = which == PLAIN_INCR ? NAME_INCR : which == PLAIN_INCRBY ? NAME_INCRBY
                 : which == PLAIN_DECR ? NAME_DECR : NAME_DECRBY;
            t->plain_calls[which]++;
        } else if (argc >= 3 && argc % 2 == 1 && name_is(name, name_len, "MSET")) {
            /* All or nothing: the whole command is there and every pair fits the budget. */
            const char *pairs = q;
            for (long long i = 1; i < argc && q != NULL; i += 2) {
                if ((q = parse_bulk(q, end, max_bulk, &key, &key_len)) != NULL
                        && (q = parse_bulk(q, end, max_bulk, &value, &value_len)) != NULL
                        && (long long)key_len + value_len + t->overhead > t->max_bytes)
                    q = NULL;
            }
            if (q == NULL)
                break;
            for (const char *k = pairs; k < q;) {
                k = parse_bulk(k, end, max_bulk, &key, &key_len);
                k = parse_bulk(k, end, max_bulk, &value, &value_len);
                if (store(t, key, key_len, hash_buffer(key, key_len), NULL, value, value_len, 0) < 0)
                    goto error;
            }
            if (reply_bytes(t, &len, "+OK\r\n", 5) < 0)
                goto error;
            last = NAME_MSET;
            t->plain_calls[PLAIN_MSET]++;
        } else if (argc >= 2 && name_is(name, name_len, "MGET")) {
            /* The whole command must be there before any key is read. */
            const char *keys = q;
            for (long long i = 1; i < argc && q != NULL; i++)
                q = parse_bulk(q, end, max_bulk, &key, &key_len);
            if (q == NULL)
                break;
            if (out_reserve(t, &len, 24) < 0)
                goto error;
            len += format_line(t->out + len, '*', argc - 1);
            for (const char *k = keys; k < q;) {
                k = parse_bulk(k, end, max_bulk, &key, &key_len);
                int32_t s = live_slot(t, key, key_len, hash_buffer(key, key_len), &now);
                if (s == -2 || reply_value(t, &len, s, null_reply, null_len) < 0)
                    goto error;
            }
            last = NAME_MGET;
            t->plain_calls[PLAIN_MGET]++;
        } else {
            break;
        }
        p = q;
        count++;
    }
    PyBuffer_Release(&view);
    PyObject *reply = PyBytes_FromStringAndSize(t->out, (Py_ssize_t)len);
    out_trim(t);
    if (reply == NULL)
        return NULL;
    return Py_BuildValue("(NnnO)", reply, (Py_ssize_t)(p - begin), count, last);
error:
    PyBuffer_Release(&view);
    out_trim(t);
    return NULL;
}

/* ---------------------------------------------------------------- snapshots of the key list
 *
 * snapshot() -> a sequence over the keys live now, least recently used first, stored as
 * (slot number, low hash bits): 8 bytes per key instead of a bytes object each. Reading it
 * (len, an index, a slice) yields the key now in each recorded slot, or skips the slot (an
 * index gives None) when it is free or holds another key (a different hash). A key live
 * from the snapshot to the read is always yielded; a key written meanwhile may be, when it
 * took a recorded slot with equal low hash bits. */

typedef struct {
    int32_t slot;
    uint32_t hash;
} Mark;

typedef struct {
    PyObject_HEAD
    Table *table;
    Py_ssize_t n;
    Mark *marks;
} Snapshot;

static PyTypeObject SnapshotType;

/* The key now at mark i, a new reference; Py_None when the slot no longer holds it. */
static PyObject *
Snapshot_key(Snapshot *snap, Py_ssize_t i)
{
    Table *t = snap->table;
    Mark m = snap->marks[i];
    if (m.slot >= t->slots_used || t->slots[m.slot].entry == NULL || t->slots[m.slot].hash != m.hash)
        Py_RETURN_NONE;
    return key_object(&t->slots[m.slot]);
}

static Py_ssize_t
Snapshot_len(Snapshot *snap)
{
    return snap->n;
}

static PyObject *
Snapshot_subscript(Snapshot *snap, PyObject *item)
{
    if (PyIndex_Check(item)) {
        Py_ssize_t i = PyNumber_AsSsize_t(item, PyExc_IndexError);
        if (i == -1 && PyErr_Occurred())
            return NULL;
        if (i < 0)
            i += snap->n;
        if (i < 0 || i >= snap->n) {
            PyErr_SetString(PyExc_IndexError, "snapshot index out of range");
            return NULL;
        }
        return Snapshot_key(snap, i);
    }
    if (!PySlice_Check(item)) {
        PyErr_Format(PyExc_TypeError, "snapshot indices must be integers or slices, not %.100s",
                     Py_TYPE(item)->tp_name);
        return NULL;
    }
    Py_ssize_t start, stop, step;
    if (PySlice_Unpack(item, &start, &stop, &step) < 0)
        return NULL;
    Py_ssize_t length = PySlice_AdjustIndices(snap->n, &start, &stop, step);
    PyObject *keys = PyList_New(0);
    if (keys == NULL)
        return NULL;
    for (Py_ssize_t k = 0, i = start; k < length; k++, i += step) {
        PyObject *key = Snapshot_key(snap, i);
        if (key == NULL || (key != Py_None && PyList_Append(keys, key) < 0)) {
            Py_XDECREF(key);
            Py_DECREF(keys);
            return NULL;
        }
        Py_DECREF(key);
    }
    return keys;
}

static void
Snapshot_dealloc(Snapshot *snap)
{
    PyMem_Free(snap->marks);
    Py_XDECREF(snap->table);
    Py_TYPE(snap)->tp_free((PyObject *)snap);
}

static PyObject *
Table_snapshot(Table *t, PyObject *unused)
{
    Snapshot *snap = PyObject_New(Snapshot, &SnapshotType);
    if (snap == NULL)
        return NULL;
    snap->table = (Table *)Py_NewRef(t);
    snap->n = 0;
    snap->marks = PyMem_Malloc((size_t)(t->count ? t->count : 1) * sizeof(Mark));
    if (snap->marks == NULL) {
        Py_DECREF(snap);
        return PyErr_NoMemory();
    }
    for (int32_t s = t->lru_head; s != NIL; s = t->slots[s].next)
        snap->marks[snap->n++] = (Mark){s, t->slots[s].hash};
    return (PyObject *)snap;
}

static PySequenceMethods Snapshot_as_sequence = {
    .sq_length = (lenfunc)Snapshot_len,
};

static PyMappingMethods Snapshot_as_mapping = {
    .mp_length = (lenfunc)Snapshot_len,
    .mp_subscript = (binaryfunc)Snapshot_subscript,
};

static PyTypeObject SnapshotType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "arca.archive._l1table.Snapshot",
    .tp_doc = "The keys of a Table at one moment, LRU first, read back as they are now (see snapshot()).",
    .tp_basicsize = sizeof(Snapshot),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_dealloc = (destructor)Snapshot_dealloc,
    .tp_as_sequence = &Snapshot_as_sequence,
    .tp_as_mapping = &Snapshot_as_mapping,
};

/* ---------------------------------------------------------------- attributes */

static int
Table_set_max_bytes(Table *t, PyObject *value, void *unused)
{
    if (value == NULL) {
        PyErr_SetString(PyExc_AttributeError, "cannot delete max_bytes");
        return -1;
    }
    long long v = PyLong_AsLongLong(value);
    if (v == -1 && PyErr_Occurred())
        return -1;
    if (v < 0) {
        PyErr_SetString(PyExc_ValueError, "max_bytes must be >= 0");
        return -1;
    }
    t->max_bytes = v;
    return 0;
}

static PyObject *
Table_get_max_bytes(Table *t, void *unused)
{
    return PyLong_FromLongLong(t->max_bytes);
}

#define COUNTER(name) \
    static PyObject *Table_get_##name(Table *t, void *unused) { return PyLong_FromLongLong((long long)t->name); }
COUNTER(used_bytes)
COUNTER(overhead)
COUNTER(hits)
COUNTER(misses)
COUNTER(evicted)
COUNTER(expired)
COUNTER(ttl_count)

/* _epoch: the dirty epoch, settable so tests can reach its wrap-around. */
static PyObject *
Table_get_epoch(Table *t, void *unused)
{
    return PyLong_FromUnsignedLong(t->epoch);
}

static int
Table_set_epoch(Table *t, PyObject *value, void *unused)
{
    unsigned long v = value == NULL ? 0 : PyLong_AsUnsignedLong(value);
    if (v == (unsigned long)-1 && PyErr_Occurred())
        return -1;
    if (v == 0 || v > UINT32_MAX) {
        PyErr_SetString(PyExc_ValueError, "_epoch must be in 1..2**32-1");
        return -1;
    }
    /* Marks of the old numbering mean nothing in the new one: none is listed any more. */
    if (PyList_SetSlice(t->dirty, 0, PyList_GET_SIZE(t->dirty), NULL) < 0)
        return -1;
    for (int32_t s = 0; s < t->slots_used; s++)
        t->slots[s].dirty_epoch = (uint32_t)v - 1;
    t->epoch = (uint32_t)v;
    return 0;
}

static PyObject *
Table_get_dirty(Table *t, void *unused)
{
    return Py_NewRef(t->dirty);
}

static PyObject *
Table_get_plain_calls(Table *t, void *unused)
{
    long long *c = t->plain_calls;
    return Py_BuildValue("(LLLLLLLLL)", c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7], c[8]);
}

static PyGetSetDef Table_getset[] = {
    {"max_bytes", (getter)Table_get_max_bytes, (setter)Table_set_max_bytes, "the byte budget", NULL},
    {"used_bytes", (getter)Table_get_used_bytes, NULL, "key + value + overhead bytes of every entry", NULL},
    {"overhead", (getter)Table_get_overhead, NULL, "bytes counted per entry on top of key and value", NULL},
    {"hits", (getter)Table_get_hits, NULL, "reads that found their key", NULL},
    {"misses", (getter)Table_get_misses, NULL, "reads that did not", NULL},
    {"evicted", (getter)Table_get_evicted, NULL, "entries dropped to fit the budget", NULL},
    {"expired", (getter)Table_get_expired, NULL, "entries dropped at their deadline", NULL},
    {"ttl_count", (getter)Table_get_ttl_count, NULL, "entries with a deadline", NULL},
    {"dirty", (getter)Table_get_dirty, NULL, "keys changed since clear_dirty() (a key may repeat)", NULL},
    {"_epoch", (getter)Table_get_epoch, (setter)Table_set_epoch, "the dirty epoch (setting it empties dirty)", NULL},
    {"plain_calls", (getter)Table_get_plain_calls, NULL,
     "commands run() served: (get, set, ping, mget, mset, incr, decr, incrby, decrby)", NULL},
    {NULL},
};

static PyMethodDef Table_methods[] = {
    {"get", (PyCFunction)Table_get, METH_O, "get(key) -> value or None: a read (lazy expiry, LRU, hits)"},
    {"get_with_deadline", (PyCFunction)Table_get_with_deadline, METH_O, "get(key) plus the deadline"},
    {"peek_with_deadline", (PyCFunction)Table_peek_with_deadline, METH_O,
     "get_with_deadline(key) without moving the key in the LRU order"},
    {"deadline", (PyCFunction)Table_deadline, METH_O, "deadline(key) -> ms or None, no side effects"},
    {"contains", (PyCFunction)Table_contains, METH_O, "contains(key) -> bool with lazy expiry"},
    {"encoding", (PyCFunction)Table_encoding, METH_O, "encoding(key) -> OBJECT ENCODING hint (0 shape, 1 raw, 2 string) or None"},
    {"set_encoding", (PyCFunction)Table_set_encoding, METH_VARARGS, "set_encoding(key, hint) -> bool"},
    {"idle", (PyCFunction)Table_idle, METH_O, "idle(key) -> seconds since last use, or None"},
    {"put", (PyCFunction)(void (*)(void))Table_put, METH_VARARGS | METH_KEYWORDS,
     "put(key, value, deadline=None): store, most recently used, evict to fit"},
    {"set_deadline", (PyCFunction)Table_set_deadline, METH_VARARGS, "set_deadline(key, ms or None) -> bool"},
    {"delete", (PyCFunction)Table_delete, METH_O, "delete(key) -> bool"},
    {"expire", (PyCFunction)Table_expire, METH_O, "expire(key) -> bool: delete counted as expired"},
    {"evict", (PyCFunction)Table_evict, METH_NOARGS, "evict() -> entries dropped to fit max_bytes"},
    {"expire_due", (PyCFunction)(void (*)(void))Table_expire_due, METH_VARARGS | METH_KEYWORDS,
     "expire_due(limit=1000, now=None) -> entries removed (at most limit) whose deadline <= now (ms)"},
    {"keys", (PyCFunction)Table_keys, METH_NOARGS, "keys() -> list, least recently used first"},
    {"snapshot", (PyCFunction)Table_snapshot, METH_NOARGS,
     "snapshot() -> the keys now, least recently used first, 8 bytes each; read back as they are then"},
    {"ttl_items", (PyCFunction)Table_ttl_items, METH_NOARGS, "ttl_items() -> [(deadline, key)]"},
    {"clear", (PyCFunction)Table_clear, METH_NOARGS, "drop every entry and the dirty list"},
    {"clear_dirty", (PyCFunction)Table_clear_dirty, METH_NOARGS, "forget the dirty list"},
    {"encode", (PyCFunction)Table_encode, METH_O, "encode(keys) -> packed entry-log records"},
    {"run", (PyCFunction)Table_run, METH_VARARGS,
     "run(data, resp, out_cap, max_bulk[, max_items]) -> (reply, consumed, count, last name)"},
    {NULL},
};

static PySequenceMethods Table_as_sequence = {
    .sq_length = (lenfunc)Table_len,
};

static PyTypeObject TableType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "arca.archive._l1table.Table",
    .tp_doc = "Every L1 entry in RAM: hash index, LRU list, deadlines, byte budget, dirty keys.",
    .tp_basicsize = sizeof(Table),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = Table_new,
    .tp_init = (initproc)Table_init,
    .tp_dealloc = (destructor)Table_dealloc,
    .tp_methods = Table_methods,
    .tp_getset = Table_getset,
    .tp_as_sequence = &Table_as_sequence,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "arca.archive._l1table",
    .m_doc = "The L1 table and the pipelined plain-command path (see arca/archive/entries.py).",
    .m_size = -1,
};

PyMODINIT_FUNC
PyInit__l1table(void)
{
    if (PyType_Ready(&TableType) < 0 || PyType_Ready(&SnapshotType) < 0)
        return NULL;
    NAME_GET = PyBytes_FromString("get");
    NAME_SET = PyBytes_FromString("set");
    NAME_PING = PyBytes_FromString("ping");
    NAME_MGET = PyBytes_FromString("mget");
    NAME_MSET = PyBytes_FromString("mset");
    NAME_INCR = PyBytes_FromString("incr");
    NAME_DECR = PyBytes_FromString("decr");
    NAME_INCRBY = PyBytes_FromString("incrby");
    NAME_DECRBY = PyBytes_FromString("decrby");
    if (NAME_GET == NULL || NAME_SET == NULL || NAME_PING == NULL || NAME_MGET == NULL || NAME_MSET == NULL
            || NAME_INCR == NULL || NAME_DECR == NULL || NAME_INCRBY == NULL || NAME_DECRBY == NULL)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    Py_INCREF(&TableType);
    if (PyModule_AddObject(m, "Table", (PyObject *)&TableType) < 0) {
        Py_DECREF(&TableType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
