/* conn.c - the daemon's table of connections (see conn.h): lookups by id
 * and by request, the live count, a request's cancellation.  The server
 * owns the connections' sockets and buffers; this file touches neither.
 */
#include "conn.h"

#include "worker.h"

struct conn *conn_lookup(const struct llmd *d, uint32_t id)
{
	uint32_t slot = id & 0xffff;
	struct conn *c;
	if (slot >= d->max_conn_slots)
		return NULL;
	c = d->conns[slot];
	return c && c->id == id ? c : NULL;
}

int conn_find_live(const struct conn *c, uint64_t client_id)
{
	for (int32_t i = 0; i < c->n_live; i++)
		if (c->live[i].client_id == client_id)
			return i;
	return -1;
}

struct conn *conn_find_gid(const struct llmd *d, uint64_t gid, int32_t *ret_i)
{
	for (uint32_t s = 0; d->conns && s < d->max_conn_slots; s++) {
		struct conn *o = d->conns[s];
		for (int32_t i = 0; o && i < o->n_live; i++) {
			if (o->live[i].gid == gid) {
				*ret_i = i;
				return o;
			}
		}
	}
	return NULL;
}

int64_t conn_live_total(const struct llmd *d)
{
	int64_t n = 0;
	for (uint32_t i = 0; d->conns && i < d->max_conn_slots; i++)
		if (d->conns[i])
			n += d->conns[i]->n_live;
	return n;
}

void conn_cancel(struct llmd *d, struct conn *c, int32_t i)
{
	if (c->live[i].cancel_posted)
		return;
	if (worker_cancel(d->worker, c->live[i].gid) == 0)
		c->live[i].cancel_posted = 1;
}
