/* A Vulkan layer for tests: a device memory budget that vkAllocateMemory enforces.
 *
 * tests/test_vulkan.py compiles it (cc -shared) and enables it for an engine process with
 * VK_LAYER_PATH=<folder with the .so and its manifest> and VK_INSTANCE_LAYERS=VK_LAYER_TANDEM_budget.
 * Every vkAllocateMemory that would take the device's allocations past TANDEM_VK_BUDGET bytes fails
 * with VK_ERROR_OUT_OF_DEVICE_MEMORY, as a full GPU's driver does, while the device keeps reporting
 * its real memory (so a plan made from those figures runs out of memory at load). With
 * TANDEM_VK_BUDGET_STATS=<file>, the peak bytes allocated, the largest allocation and the refusals
 * are written there after each allocation.
 * One device per process (GGML_VK_VISIBLE_DEVICES=0), which is what the tests use.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <vulkan/vk_layer.h>
#include <vulkan/vulkan.h>

#if defined(__GNUC__)
#define EXPORT __attribute__((visibility("default")))
#else
#define EXPORT
#endif

static PFN_vkGetInstanceProcAddr next_gipa;
static PFN_vkGetDeviceProcAddr next_gdpa;
static PFN_vkAllocateMemory next_allocate;
static PFN_vkFreeMemory next_free;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static unsigned long long used, peak, largest, refused, budget;
static int budget_read;

struct allocation {
    VkDeviceMemory memory;
    VkDeviceSize size;
};
static struct allocation *allocations;
static size_t n_allocations, cap_allocations;

static void write_stats(void) { /* under lock */
    const char *path = getenv("TANDEM_VK_BUDGET_STATS");
    if (!path) return;
    FILE *f = fopen(path, "w");
    if (!f) return;
    fprintf(f, "peak %llu\nused %llu\nlargest %llu\nrefused %llu\nbudget %llu\n", peak, used, largest, refused,
            budget);
    fclose(f);
}

static unsigned long long the_budget(void) { /* under lock */
    if (!budget_read) {
        const char *text = getenv("TANDEM_VK_BUDGET");
        budget = text ? strtoull(text, NULL, 10) : 0;
        budget_read = 1;
    }
    return budget;
}

static VKAPI_ATTR VkResult VKAPI_CALL budget_AllocateMemory(VkDevice device, const VkMemoryAllocateInfo *info,
                                                            const VkAllocationCallbacks *alloc,
                                                            VkDeviceMemory *memory) {
    VkDeviceSize size = info->allocationSize;
    pthread_mutex_lock(&lock);
    unsigned long long limit = the_budget();
    if (limit && used + size > limit) {
        refused++;
        write_stats();
        pthread_mutex_unlock(&lock);
        return VK_ERROR_OUT_OF_DEVICE_MEMORY;
    }
    used += size;
    pthread_mutex_unlock(&lock);

    VkResult result = next_allocate(device, info, alloc, memory);

    pthread_mutex_lock(&lock);
    if (result == VK_SUCCESS) {
        if (n_allocations == cap_allocations) {
            size_t cap = cap_allocations ? 2 * cap_allocations : 256;
            struct allocation *grown = realloc(allocations, cap * sizeof *grown);
            if (grown) {
                allocations = grown;
                cap_allocations = cap;
            }
        }
        if (n_allocations < cap_allocations) allocations[n_allocations++] = (struct allocation){*memory, size};
        if (used > peak) peak = used;
        if (size > largest) largest = size;
    } else {
        used -= size;
    }
    write_stats();
    pthread_mutex_unlock(&lock);
    return result;
}

static VKAPI_ATTR void VKAPI_CALL budget_FreeMemory(VkDevice device, VkDeviceMemory memory,
                                                    const VkAllocationCallbacks *alloc) {
    pthread_mutex_lock(&lock);
    for (size_t i = 0; i < n_allocations; i++) {
        if (allocations[i].memory == memory) {
            used -= allocations[i].size;
            allocations[i] = allocations[--n_allocations];
            break;
        }
    }
    pthread_mutex_unlock(&lock);
    next_free(device, memory, alloc);
}

static VKAPI_ATTR VkResult VKAPI_CALL budget_CreateInstance(const VkInstanceCreateInfo *info,
                                                            const VkAllocationCallbacks *alloc,
                                                            VkInstance *instance) {
    VkLayerInstanceCreateInfo *link = (VkLayerInstanceCreateInfo *)info->pNext;
    while (link && !(link->sType == VK_STRUCTURE_TYPE_LOADER_INSTANCE_CREATE_INFO &&
                     link->function == VK_LAYER_LINK_INFO)) {
        link = (VkLayerInstanceCreateInfo *)link->pNext;
    }
    if (!link) return VK_ERROR_INITIALIZATION_FAILED;
    PFN_vkGetInstanceProcAddr gipa = link->u.pLayerInfo->pfnNextGetInstanceProcAddr;
    link->u.pLayerInfo = link->u.pLayerInfo->pNext;  // the next layer's turn
    PFN_vkCreateInstance create = (PFN_vkCreateInstance)gipa(VK_NULL_HANDLE, "vkCreateInstance");
    if (!create) return VK_ERROR_INITIALIZATION_FAILED;
    VkResult result = create(info, alloc, instance);
    if (result == VK_SUCCESS) next_gipa = gipa;
    return result;
}

static VKAPI_ATTR VkResult VKAPI_CALL budget_CreateDevice(VkPhysicalDevice physical, const VkDeviceCreateInfo *info,
                                                          const VkAllocationCallbacks *alloc, VkDevice *device) {
    VkLayerDeviceCreateInfo *link = (VkLayerDeviceCreateInfo *)info->pNext;
    while (link && !(link->sType == VK_STRUCTURE_TYPE_LOADER_DEVICE_CREATE_INFO &&
                     link->function == VK_LAYER_LINK_INFO)) {
        link = (VkLayerDeviceCreateInfo *)link->pNext;
    }
    if (!link) return VK_ERROR_INITIALIZATION_FAILED;
    PFN_vkGetInstanceProcAddr gipa = link->u.pLayerInfo->pfnNextGetInstanceProcAddr;
    PFN_vkGetDeviceProcAddr gdpa = link->u.pLayerInfo->pfnNextGetDeviceProcAddr;
    link->u.pLayerInfo = link->u.pLayerInfo->pNext;
    PFN_vkCreateDevice create = (PFN_vkCreateDevice)gipa(VK_NULL_HANDLE, "vkCreateDevice");
    if (!create) return VK_ERROR_INITIALIZATION_FAILED;
    VkResult result = create(physical, info, alloc, device);
    if (result == VK_SUCCESS) {
        next_gdpa = gdpa;
        next_allocate = (PFN_vkAllocateMemory)gdpa(*device, "vkAllocateMemory");
        next_free = (PFN_vkFreeMemory)gdpa(*device, "vkFreeMemory");
    }
    return result;
}

EXPORT VKAPI_ATTR PFN_vkVoidFunction VKAPI_CALL budget_GetDeviceProcAddr(VkDevice device, const char *name);

#define HOOK(fn) \
    if (!strcmp(name, "vk" #fn)) return (PFN_vkVoidFunction)budget_##fn

EXPORT VKAPI_ATTR PFN_vkVoidFunction VKAPI_CALL budget_GetDeviceProcAddr(VkDevice device, const char *name) {
    HOOK(GetDeviceProcAddr);
    HOOK(AllocateMemory);
    HOOK(FreeMemory);
    return next_gdpa ? next_gdpa(device, name) : NULL;
}

EXPORT VKAPI_ATTR PFN_vkVoidFunction VKAPI_CALL budget_GetInstanceProcAddr(VkInstance instance, const char *name) {
    HOOK(GetInstanceProcAddr);
    HOOK(CreateInstance);
    HOOK(CreateDevice);
    HOOK(GetDeviceProcAddr);
    HOOK(AllocateMemory);
    HOOK(FreeMemory);
    return next_gipa ? next_gipa(instance, name) : NULL;
}
