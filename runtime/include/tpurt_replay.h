/*
 * tpurt_replay.h — capture and replay of a recorded DeferAndFuse graph
 * (runtime/src/graph/replay.c): the part of the C API compiled graphs
 * (torch.compile(backend="tpu")) use to run a call's ops again on other
 * inputs without recording them. Kept out of tpurt.h so that only the glue
 * that uses it depends on it.
 *
 * Protocol (one compiled graph, its calls made from the same device):
 *   1. a call records its ops in DEFER mode into an empty pending graph;
 *      before the cut, tpurt_replay_capture turns that recording into a
 *      template (or says why it cannot be one);
 *   2. a later call records again; before its cut, tpurt_replay_matches
 *      compares the recording with the template relocated onto that call's
 *      inputs and outputs; equal, the template is verified;
 *   3. later calls run tpurt_replay_run instead of recording: the verified
 *      template's ops on the new inputs, with fresh output memory.
 * Inputs are given as device ranges: each distinct memory block the call's
 * input tensors live in (base address, bytes); every later call passes the
 * same number of ranges of the same sizes, in the same order. Outputs are
 * the base addresses of the output tensors' memory. A call may free whole
 * input ranges inside (recorded as frees); the template frees them at the
 * same points.
 */
#ifndef TPURT_REPLAY_H
#define TPURT_REPLAY_H

#include "tpurt.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tpurt_replay tpurt_replay;

/* The device's default generator around a recorded call: its seed, and its
 * offset before (from) and after (to) the call — the Philox blocks the
 * call's random draws reserved (NULL: none). */
typedef struct tpurt_replay_rng {
  uint64_t seed, from, to;
} tpurt_replay_rng;

/* A template of the current stream of dev's pending graph. *r is NULL and
 * why (whylen bytes) says why when the graph cannot be one; an error status
 * only for bad arguments or no host memory. */
TPURT_API tpurt_status tpurt_replay_capture(int dev, const tpurt_devptr *in, const uint64_t *in_bytes, int nin,
                                            const tpurt_devptr *out, int nout, const tpurt_replay_rng *rng,
                                            tpurt_replay **r, char *why, size_t whylen);
/* 1 if the pending graph equals template r relocated onto inputs in,
 * outputs out and the draws rng reserved (r is then verified), else 0 with
 * the first difference in why. */
TPURT_API int tpurt_replay_matches(tpurt_replay *r, const tpurt_devptr *in, int nin, const tpurt_devptr *out,
                                   int nout, const tpurt_replay_rng *rng, char *why, size_t whylen);
TPURT_API int tpurt_replay_verified(const tpurt_replay *r);
/* 1 if the graph frees input range k (the recorded call dropped its last
 * reference inside): a replay frees it at the same point, so the caller
 * must give up that memory when the replay runs. */
TPURT_API int tpurt_replay_input_freed(const tpurt_replay *r, int k);
/* Runs verified template r on inputs in (stream-ordered, asynchronous like
 * any launch); out[k] gets output k's memory (tpurt_malloc'd: the caller
 * frees it with tpurt_free). A template whose call drew random numbers
 * reserves as many blocks from gen (the default generator, its lock held
 * by the caller) and draws with them. *refused = 1 and nothing runs when r
 * is not verified, the inputs overlap otherwise than at capture, the stream
 * has pending work, or gen is NULL for a template that draws: the caller
 * records the call instead (with an error status only when out of deferred
 * buffer ids). */
TPURT_API tpurt_status tpurt_replay_run(tpurt_replay *r, const tpurt_devptr *in, int nin, tpurt_devptr *out,
                                        tpurt_generator *gen, int *refused);
TPURT_API void tpurt_replay_destroy(tpurt_replay *r);

#ifdef __cplusplus
}
#endif

#endif
