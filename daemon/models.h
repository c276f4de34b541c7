/* models.h - the models a daemon serves, as the event loop sees them:
 * loading on demand (a loader thread per load makes the engine; requests
 * for the model wait in the worker meanwhile), unloading idle ones after
 * their keep-alive, and one memory budget for the weights and KV pools of
 * the models loaded at once (idle ones are unloaded least recently used
 * first to make room; pinned ones never).  Event-loop thread.
 */
#ifndef LLMD_MODELS_H
#define LLMD_MODELS_H

#include <stddef.h>
#include <stdint.h>

#include "llmd.h"

struct worker_snapshot;

struct model;

/* Reads the Jinja chat template at PATH (model.chat_template,
 * models.NAME.chat_template) into M, in place of the file's.  0, or a
 * negative errno with the reason in ERR. */
int models_read_chat_template(struct model *m, const char *path, char *err, size_t errlen);

/* After the default model's worker exists: the budget, and each [models]
 * entry's file read (its tokenizer, template and sizes: requests for it
 * can be checked and tokenized before it is loaded); pinned ones are
 * loaded now, before the engine thread starts.  0, or a negative errno
 * with the reason in ERR (llmd does not start). */
int models_start(struct llmd *d, char *err, size_t errlen);

/* A request for LM is about to be posted: LM is made ready or loading
 * (unloading idle models to fit the budget).  0, or an enum proto_err with
 * MSG (the budget cannot hold it: the numbers). */
uint32_t models_want(struct llmd *d, struct llmd_model *lm, char *msg, size_t msglen);

/* llmctl unload: LM is unloaded when idle.  0, or an enum proto_err with MSG. */
uint32_t models_unload(struct llmd *d, struct llmd_model *lm, char *msg, size_t msglen);

/* The engine thread's answer to an unload (WORKER_NOTE_UNLOADED). */
void models_unloaded(struct llmd *d, int index, int error);

/* From the event loop's timer: models idle past their keep-alive are
 * unloaded, and models with requests are marked used. */
void models_tick(struct llmd *d, double now);

/* Bytes of the models loaded or loading now (what the budget holds). */
uint64_t models_bytes_in_use(const struct llmd *d);

/* State names for llmctl: "unloaded", "loading", ... */
const char *models_state_name(enum llmd_model_state s);

/* At exit, after the event loop: waits for loads still running. */
void models_stop(struct llmd *d);

#endif
