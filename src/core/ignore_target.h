/* The target id that means "no loss here": one value for the data that writes it (chat rows
 * mask everything but assistant output) and the loss ops that skip it. */
#ifndef QT_IGNORE_TARGET_H
#define QT_IGNORE_TARGET_H

#define CE_IGNORE (-100) /* as transformers' ignore_index */

#endif
