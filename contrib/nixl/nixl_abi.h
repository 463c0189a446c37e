/*
 * The backend plug-in ABI of NIXL 1.5.1 (plug-in API version 1), declared here so that the
 * plug-in builds without NIXL's sources or headers, which its wheels do not ship.
 *
 * NIXL loads libplugin_<NAME>.so from NIXL_PLUGIN_DIR (default: plugins/ beside libnixl.so),
 * calls nixl_plugin_init() and, from the table it returns, create_engine() once per agent
 * that asks for the backend. From then on it calls the engine through its vtable and reads
 * a few of the base class's members through inline functions of its own headers, so what is
 * declared here must match NIXL's layout exactly: the order of the virtual functions, the
 * base class's data members, and the standard library types passed by reference (built with
 * the C++11 string ABI, as NIXL's GCC 14 build is). Only what the plug-in uses is declared
 * beyond that; descriptor lists are only read, through their vector of descriptors.
 *
 * The layout was checked against the 1.5.1 wheel (nixl-cu13): the vtable of its UCX
 * plug-in's engine gives the order, and test/nixl/test_nixl.py drives the result through
 * NIXL's own agent. A NIXL with another plug-in API version refuses this plug-in at load
 * ("Plugin API version mismatch"), which is the check this declaration relies on.
 */
#ifndef XFER_NIXL_ABI_H
#define XFER_NIXL_ABI_H

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#define XFER_NIXL_PLUGIN_API_VERSION 1

enum nixl_mem_t { DRAM_SEG, VRAM_SEG, BLK_SEG, OBJ_SEG, FILE_SEG };
enum nixl_xfer_op_t { NIXL_READ, NIXL_WRITE };

enum nixl_status_t {
    NIXL_IN_PROG               = 1,
    NIXL_SUCCESS               = 0,
    NIXL_ERR_NOT_POSTED        = -1,
    NIXL_ERR_INVALID_PARAM     = -2,
    NIXL_ERR_BACKEND           = -3,
    NIXL_ERR_NOT_FOUND         = -4,
    NIXL_ERR_MISMATCH          = -5,
    NIXL_ERR_NOT_ALLOWED       = -6,
    NIXL_ERR_REPOST_ACTIVE     = -7,
    NIXL_ERR_UNKNOWN           = -8,
    NIXL_ERR_NOT_SUPPORTED     = -9,
    NIXL_ERR_REMOTE_DISCONNECT = -10,
    NIXL_ERR_CANCELED          = -11,
    NIXL_ERR_NO_TELEMETRY      = -12,
};

enum class nixl_thread_sync_t { NONE, STRICT, RW };
enum class nixl_cost_t { ANALYTICAL_BACKEND = 0 };

using nixl_backend_t    = std::string;
using nixl_blob_t       = std::string;
using nixl_mem_list_t   = std::vector<nixl_mem_t>;
using nixl_b_params_t   = std::unordered_map<std::string, std::string>;
using nixl_query_resp_t = std::optional<nixl_b_params_t>;
using nixlMemViewH      = void *;
/* (remote agent, message) */
using notif_list_t = std::vector<std::pair<std::string, std::string>>;

struct nixlAgentOptionalArgs;   /* only passed through, never read */

struct nixlBackendOptionalArgs {
    nixl_blob_t notifMsg;
    bool        hasNotif = false;
    nixl_blob_t customParam;
};
using nixl_opt_b_args_t = nixlBackendOptionalArgs;

class nixlBackendInitParams {
public:
    std::string        localAgent;
    nixl_backend_t     type;
    nixl_b_params_t    *customParams;
    bool               enableProgTh;
    uint64_t           pthrDelay;       /* microseconds */
    nixl_thread_sync_t syncMode;
    bool               enableTelemetry_;
};

/* A transfer handle and a registration, as the engine makes them: NIXL keeps the pointers and
 * hands them back; it deletes neither (releaseReqH, deregisterMem and unloadMD do). */
class nixlBackendReqH {
public:
    virtual ~nixlBackendReqH() = default;
};

class nixlBackendMD {
protected:
    bool isPrivateMD;

public:
    explicit nixlBackendMD(bool is_private) : isPrivateMD(is_private) {}
    virtual ~nixlBackendMD() = default;
};

class nixlBasicDesc {
public:
    uintptr_t addr;
    size_t    len;
    uint64_t  devId;
};

class nixlBlobDesc : public nixlBasicDesc {
public:
    nixl_blob_t metaInfo;   /* registration: the user's; loadRemoteMD: the peer's public data */
};

class nixlMetaDesc : public nixlBasicDesc {
public:
    nixlBackendMD *metadataP;   /* the engine's registration (or loaded peer's) covering it */
};

struct nixlRemoteMetaDesc : public nixlMetaDesc {
    std::string remoteAgent;
};

/* NIXL's descriptor list: polymorphic (its virtual functions are NIXL's and never called
 * here, so they are not declared: the vtable pointer is the first member either way). */
template <class T> class nixlDescList {
    void           *vptr_;
    nixl_mem_t     type_;
    std::vector<T> descs_;

public:
    nixlDescList()                     = delete;    /* NIXL's objects, only read */
    nixl_mem_t getType() const { return type_; }
    size_t descCount() const { return descs_.size(); }
    const T &operator[](size_t i) const { return descs_[i]; }
};
using nixl_meta_dlist_t        = nixlDescList<nixlMetaDesc>;
using nixl_remote_meta_dlist_t = nixlDescList<nixlRemoteMetaDesc>;
using nixl_reg_dlist_t         = nixlDescList<nixlBlobDesc>;

/* The element of the telemetry vector: never added to by this plug-in, so only its vector's
 * layout (three pointers, whatever the element) matters. */
struct nixlTelemetryEventUnused {
    char unused;
};

class nixlBackendEngine {
private:
    nixl_backend_t                        backendType;
    nixl_b_params_t                       customParams;
    std::vector<nixlTelemetryEventUnused> telemetryEvents_;
    std::mutex                            telemetryEventsMutex_;

protected:
    bool              initErr = false;     /* set in the constructor: NIXL destroys the engine */
    const std::string localAgent;
    const bool        enableTelemetry_;

public:
    explicit nixlBackendEngine(const nixlBackendInitParams *p)
        : backendType(p->type), customParams(*p->customParams), localAgent(p->localAgent),
          enableTelemetry_(p->enableTelemetry_)
    {
    }
    virtual ~nixlBackendEngine() = default;

    virtual bool supportsRemote() const                   = 0;
    virtual bool supportsLocal() const                    = 0;
    virtual bool supportsNotif() const                    = 0;
    virtual nixl_mem_list_t getSupportedMems() const      = 0;
    virtual nixl_status_t registerMem(const nixlBlobDesc &mem, const nixl_mem_t &nixl_mem,
                                      nixlBackendMD *&out) = 0;
    virtual nixl_status_t deregisterMem(nixlBackendMD *meta)        = 0;
    virtual nixl_status_t connect(const std::string &remote_agent)    = 0;
    virtual nixl_status_t disconnect(const std::string &remote_agent) = 0;
    virtual nixl_status_t unloadMD(nixlBackendMD *input)             = 0;
    virtual nixl_status_t prepXfer(const nixl_xfer_op_t &operation, const nixl_meta_dlist_t &local,
                                   const nixl_meta_dlist_t &remote,
                                   const std::string &remote_agent, nixlBackendReqH *&handle,
                                   const nixl_opt_b_args_t *opt_args = nullptr) const = 0;
    virtual nixl_status_t postXfer(const nixl_xfer_op_t &operation, const nixl_meta_dlist_t &local,
                                   const nixl_meta_dlist_t &remote,
                                   const std::string &remote_agent, nixlBackendReqH *&handle,
                                   const nixl_opt_b_args_t *opt_args = nullptr) const = 0;
    virtual nixl_status_t checkXfer(nixlBackendReqH *handle) const   = 0;
    virtual nixl_status_t releaseReqH(nixlBackendReqH *handle) const = 0;

    /* NIXL's defaults for what a backend need not offer */
    virtual nixl_status_t prepMemView(const nixl_remote_meta_dlist_t &, nixlMemViewH &,
                                      const nixl_opt_b_args_t * = nullptr) const
    {
        return NIXL_ERR_NOT_SUPPORTED;
    }
    virtual nixl_status_t prepMemView(const nixl_meta_dlist_t &, nixlMemViewH &,
                                      const nixl_opt_b_args_t * = nullptr) const
    {
        return NIXL_ERR_NOT_SUPPORTED;
    }
    virtual void releaseMemView(nixlMemViewH) const {}
    virtual nixl_status_t getPublicData(const nixlBackendMD *, std::string &) const
    {
        return NIXL_ERR_BACKEND;
    }
    virtual nixl_status_t getConnInfo(std::string &) const { return NIXL_ERR_BACKEND; }
    virtual nixl_status_t loadRemoteConnInfo(const std::string &, const std::string &)
    {
        return NIXL_ERR_BACKEND;
    }
    virtual nixl_status_t loadRemoteMD(const nixlBlobDesc &, const nixl_mem_t &,
                                       const std::string &, nixlBackendMD *&)
    {
        return NIXL_ERR_BACKEND;
    }
    virtual nixl_status_t loadLocalMD(nixlBackendMD *, nixlBackendMD *&)
    {
        return NIXL_ERR_BACKEND;
    }
    virtual nixl_status_t getNotifs(notif_list_t &) { return NIXL_ERR_BACKEND; }
    virtual nixl_status_t genNotif(const std::string &, const std::string &) const
    {
        return NIXL_ERR_BACKEND;
    }
    virtual nixl_status_t queryMem(const nixl_reg_dlist_t &,
                                   std::vector<nixl_query_resp_t> &) const
    {
        return NIXL_ERR_NOT_SUPPORTED;
    }
    virtual nixl_status_t estimateXferCost(const nixl_xfer_op_t &, const nixl_meta_dlist_t &,
                                           const nixl_meta_dlist_t &, const std::string &,
                                           nixlBackendReqH *const &, std::chrono::microseconds &,
                                           std::chrono::microseconds &, nixl_cost_t &,
                                           const nixlAgentOptionalArgs * = nullptr) const
    {
        return NIXL_ERR_NOT_SUPPORTED;
    }
};

/* What nixl_plugin_init() returns. */
class nixlBackendPlugin {
public:
    int api_version;
    nixlBackendEngine *(*create_engine)(const nixlBackendInitParams *init_params);
    void (*destroy_engine)(nixlBackendEngine *engine);
    const char *(*get_plugin_name)();
    const char *(*get_plugin_version)();
    nixl_b_params_t (*get_backend_options)();
    nixl_mem_list_t (*get_backend_mems)();
};

#endif /* XFER_NIXL_ABI_H */
