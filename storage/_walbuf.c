/* A SQLite VFS over the default one that gathers the group commit's WAL writes.

SQLite writes a WAL frame with two system calls, its 24-byte header and then its page, so
a commit of ten pages costs twenty pwrite calls (at one connection, 21 a request by
strace). This VFS keeps a WAL file's writes in memory while they follow each other, and
writes them with one call once the commit frame (a frame header whose "database size"
field is not zero) has its page: the writes reach the file, and any error is returned,
inside the very xWrite SQLite made for that page, before it publishes the commit in the
wal-index. So other connections and processes, which read frames only once the wal-index
says they are committed, never see the difference, and a crash loses nothing SQLite
reported committed.

That holds because the writer's connection writes no frame before its commit: it sets
cache_spill off (a transaction's pages stay in its cache, so no frame is overwritten and
no checksum rewritten afterwards), and the default VFS reports power-safe overwrite (no
frame is written twice to pad a sector under synchronous FULL). What SQLite reads, syncs, truncates or sizes of a WAL file with writes
still gathered, and its close, writes them first. Database files pass through untouched,
as do locks: the default VFS's own file objects are used, so its POSIX lock bookkeeping is
the one every connection of the process shares. */

#include <sqlite3.h>
#include <stdlib.h>
#include <string.h>

#include "_walbuf.h"

#define FRAME_HEADER 24
/* Gathered bytes at most: the default VFS's unixWrite masks a write's length to 17 bits
   (seekAndWrite), so a longer one would come out short, as a full disk. */
#define GATHER_MAX 0x1ffff

typedef struct WalBufFile WalBufFile;
struct WalBufFile {
    sqlite3_file base;
    sqlite3_file *real; /* the default VFS's file, allocated right after this struct */
    WalBufFile *wal;    /* a database's file: its WAL file while that is open */
    WalBufFile *db;     /* a WAL file: its database's file, while that is open */
    int is_wal;
    unsigned char *gathered;
    sqlite3_int64 start; /* the file offset of gathered[0] */
    int used;
    int commit_frame; /* the last write was a commit frame's header */
};

static sqlite3_vfs *real_vfs;

static int write_gathered(WalBufFile *f) {
    if (f->used == 0)
        return SQLITE_OK;
    int used = f->used;
    f->used = 0;
    return f->real->pMethods->xWrite(f->real, f->gathered, used, f->start);
}

static int room_for(WalBufFile *f, int amount) {
    if (!f->gathered && !(f->gathered = malloc(GATHER_MAX)))
        return 0;
    return f->used + amount <= GATHER_MAX;
}

static int is_commit_header(const unsigned char *header) {
    return header[4] | header[5] | header[6] | header[7]; /* the database size after it */
}

static int gather(WalBufFile *f, const void *data, int amount, sqlite3_int64 offset) {
    /* The page after a commit frame's header ends the commit: it is written in this call,
       whatever was written out to make room for it. */
    int ends_commit = amount != FRAME_HEADER && f->commit_frame;
    f->commit_frame = amount == FRAME_HEADER && is_commit_header(data);
    int rc;
    if (f->used && offset != f->start + f->used && (rc = write_gathered(f)) != SQLITE_OK)
        return rc;
    if (!room_for(f, amount)) {
        if ((rc = write_gathered(f)) != SQLITE_OK)
            return rc;
        if (!room_for(f, amount)) /* no memory for the buffer: written alone */
            return f->real->pMethods->xWrite(f->real, data, amount, offset);
    }
    if (f->used == 0)
        f->start = offset;
    memcpy(f->gathered + f->used, data, (size_t)amount);
    f->used += amount;
    return ends_commit ? write_gathered(f) : SQLITE_OK;
}

#define REAL(file) (((WalBufFile *)(file))->real)
#define FLUSHED(file)                                                                    \
    do {                                                                                 \
        int flush_rc = write_gathered((WalBufFile *)(file));                             \
        if (flush_rc != SQLITE_OK)                                                       \
            return flush_rc;                                                             \
    } while (0)

static int wb_close(sqlite3_file *file) {
    WalBufFile *f = (WalBufFile *)file;
    int rc = write_gathered(f);
    if (f->db)
        f->db->wal = NULL;
    if (f->wal)
        f->wal->db = NULL;
    free(f->gathered);
    f->gathered = NULL;
    int closed = f->real->pMethods->xClose(f->real);
    return rc != SQLITE_OK ? rc : closed;
}

static int wb_read(sqlite3_file *file, void *data, int amount, sqlite3_int64 offset) {
    FLUSHED(file);
    return REAL(file)->pMethods->xRead(REAL(file), data, amount, offset);
}

static int wb_write(sqlite3_file *file, const void *data, int amount, sqlite3_int64 offset) {
    WalBufFile *f = (WalBufFile *)file;
    if (f->is_wal)
        return gather(f, data, amount, offset);
    return f->real->pMethods->xWrite(f->real, data, amount, offset);
}

static int wb_truncate(sqlite3_file *file, sqlite3_int64 size) {
    FLUSHED(file);
    return REAL(file)->pMethods->xTruncate(REAL(file), size);
}

static int wb_sync(sqlite3_file *file, int flags) {
    FLUSHED(file);
    return REAL(file)->pMethods->xSync(REAL(file), flags);
}

static int wb_file_size(sqlite3_file *file, sqlite3_int64 *size) {
    FLUSHED(file);
    return REAL(file)->pMethods->xFileSize(REAL(file), size);
}

static int wb_lock(sqlite3_file *file, int level) {
    return REAL(file)->pMethods->xLock(REAL(file), level);
}

static int wb_unlock(sqlite3_file *file, int level) {
    return REAL(file)->pMethods->xUnlock(REAL(file), level);
}

static int wb_check_reserved_lock(sqlite3_file *file, int *out) {
    return REAL(file)->pMethods->xCheckReservedLock(REAL(file), out);
}

static int wb_file_control(sqlite3_file *file, int op, void *arg) {
    FLUSHED(file);
    return REAL(file)->pMethods->xFileControl(REAL(file), op, arg);
}

static int wb_sector_size(sqlite3_file *file) {
    return REAL(file)->pMethods->xSectorSize(REAL(file));
}

static int wb_device_characteristics(sqlite3_file *file) {
    return REAL(file)->pMethods->xDeviceCharacteristics(REAL(file));
}

static int wb_shm_map(sqlite3_file *file, int page, int size, int extend, void volatile **out) {
    return REAL(file)->pMethods->xShmMap(REAL(file), page, size, extend, out);
}

static int wb_shm_lock(sqlite3_file *file, int offset, int n, int flags) {
    return REAL(file)->pMethods->xShmLock(REAL(file), offset, n, flags);
}

/* SQLite publishes a commit in the wal-index between two barriers. Nothing is gathered by
   then (a commit frame's page is written in its own xWrite); should anything be, it goes
   to the file first, though a barrier cannot report a failure. */
static void wb_shm_barrier(sqlite3_file *file) {
    WalBufFile *f = (WalBufFile *)file;
    if (f->wal)
        write_gathered(f->wal);
    f->real->pMethods->xShmBarrier(f->real);
}

static int wb_shm_unmap(sqlite3_file *file, int delete_flag) {
    return REAL(file)->pMethods->xShmUnmap(REAL(file), delete_flag);
}

static int wb_fetch(sqlite3_file *file, sqlite3_int64 offset, int amount, void **out) {
    return REAL(file)->pMethods->xFetch(REAL(file), offset, amount, out);
}

static int wb_unfetch(sqlite3_file *file, sqlite3_int64 offset, void *page) {
    return REAL(file)->pMethods->xUnfetch(REAL(file), offset, page);
}

static const sqlite3_io_methods wb_methods = {
    3,
    wb_close,
    wb_read,
    wb_write,
    wb_truncate,
    wb_sync,
    wb_file_size,
    wb_lock,
    wb_unlock,
    wb_check_reserved_lock,
    wb_file_control,
    wb_sector_size,
    wb_device_characteristics,
    wb_shm_map,
    wb_shm_lock,
    wb_shm_barrier,
    wb_shm_unmap,
    wb_fetch,
    wb_unfetch,
};

static int wb_open(sqlite3_vfs *vfs, const char *name, sqlite3_file *file, int flags,
                   int *out_flags) {
    WalBufFile *f = (WalBufFile *)file;
    memset(f, 0, sizeof *f);
    f->real = (sqlite3_file *)&f[1];
    int rc = real_vfs->xOpen(real_vfs, name, f->real, flags, out_flags);
    if (f->real->pMethods == NULL) {
        f->base.pMethods = NULL;
        return rc;
    }
    if (f->real->pMethods->iVersion < 3) { /* the default VFS on unix is version 3 */
        f->real->pMethods->xClose(f->real);
        f->base.pMethods = NULL;
        return SQLITE_CANTOPEN;
    }
    f->base.pMethods = &wb_methods;
    if (rc == SQLITE_OK && (flags & SQLITE_OPEN_WAL)) {
        f->is_wal = 1;
        f->db = (WalBufFile *)sqlite3_database_file_object(name);
        f->db->wal = f;
    }
    return rc;
}

static int wb_delete(sqlite3_vfs *vfs, const char *name, int sync_dir) {
    return real_vfs->xDelete(real_vfs, name, sync_dir);
}

static int wb_access(sqlite3_vfs *vfs, const char *name, int flags, int *out) {
    return real_vfs->xAccess(real_vfs, name, flags, out);
}

static int wb_full_pathname(sqlite3_vfs *vfs, const char *name, int size, char *out) {
    return real_vfs->xFullPathname(real_vfs, name, size, out);
}

static void *wb_dl_open(sqlite3_vfs *vfs, const char *name) {
    return real_vfs->xDlOpen(real_vfs, name);
}

static void wb_dl_error(sqlite3_vfs *vfs, int size, char *out) {
    real_vfs->xDlError(real_vfs, size, out);
}

static void (*wb_dl_sym(sqlite3_vfs *vfs, void *handle, const char *symbol))(void) {
    return real_vfs->xDlSym(real_vfs, handle, symbol);
}

static void wb_dl_close(sqlite3_vfs *vfs, void *handle) {
    real_vfs->xDlClose(real_vfs, handle);
}

static int wb_randomness(sqlite3_vfs *vfs, int size, char *out) {
    return real_vfs->xRandomness(real_vfs, size, out);
}

static int wb_sleep(sqlite3_vfs *vfs, int microseconds) {
    return real_vfs->xSleep(real_vfs, microseconds);
}

static int wb_current_time(sqlite3_vfs *vfs, double *out) {
    return real_vfs->xCurrentTime(real_vfs, out);
}

static int wb_get_last_error(sqlite3_vfs *vfs, int size, char *out) {
    return real_vfs->xGetLastError(real_vfs, size, out);
}

static int wb_current_time_int64(sqlite3_vfs *vfs, sqlite3_int64 *out) {
    return real_vfs->xCurrentTimeInt64(real_vfs, out);
}

static sqlite3_vfs wb_vfs = {
    .iVersion = 2,
    .zName = WALBUF_VFS,
    .xOpen = wb_open,
    .xDelete = wb_delete,
    .xAccess = wb_access,
    .xFullPathname = wb_full_pathname,
    .xDlOpen = wb_dl_open,
    .xDlError = wb_dl_error,
    .xDlSym = wb_dl_sym,
    .xDlClose = wb_dl_close,
    .xRandomness = wb_randomness,
    .xSleep = wb_sleep,
    .xCurrentTime = wb_current_time,
    .xGetLastError = wb_get_last_error,
    .xCurrentTimeInt64 = wb_current_time_int64,
};

int walbuf_register(void) {
    if (real_vfs)
        return SQLITE_OK;
    sqlite3_vfs *found = sqlite3_vfs_find(NULL);
    if (!found || found->iVersion < 2)
        return SQLITE_ERROR;
    real_vfs = found;
    wb_vfs.szOsFile = (int)sizeof(WalBufFile) + found->szOsFile;
    wb_vfs.mxPathname = found->mxPathname;
    return sqlite3_vfs_register(&wb_vfs, 0);
}
