/* The job config a checkpoint was written under, key by key, so that a resume can say which
 * keys changed since: a reshard changes only [parallelism] (the mesh), which is no reason to
 * warn, while any other change is named in a warning. */
#ifndef QT_CKPT_CONFIG_H
#define QT_CKPT_CONFIG_H

#include <jansson.h>

#include "core/config.h"

/* cfg as config_dump writes it, one member per key: {"section.key": "value as in TOML"};
 * the i-th [[override]] table's keys are "override[i].key". A new reference. */
json_t *ckpt_config_keys(const JobConfig *cfg);

/* The keys whose values differ between saved and now (either may lack a key), as
 * "section.key = OLD (now NEW)" joined by ", ", malloc'd, or NULL when none differ. mesh = 1
 * lists only the [parallelism] keys, mesh = 0 every other key except those that steer the
 * resume itself or say where the run keeps its files (checkpoint.load_step,
 * checkpoint.exclude_from_loading, job.dump_folder, checkpoint.folder): a copied checkpoint
 * folder resumed with them changed computes the same run. */
char *ckpt_config_changes(json_t *saved, json_t *now, int mesh);

#endif
