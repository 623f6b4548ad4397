/* The VFS that gathers a WAL file's writes (see _walbuf.c). */
#ifndef MODEL_GATEWAY_WALBUF_H
#define MODEL_GATEWAY_WALBUF_H

#define WALBUF_VFS "model-gateway-walbuf"

/* Register the VFS (not as the default) over the default one; SQLITE_OK, or an error. */
int walbuf_register(void);

#endif
